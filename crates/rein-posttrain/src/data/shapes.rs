//! The generated visual task (`[data.shapes_task]`): each example is a PNG of a square board of
//! `grid × grid` cells on white, each cell holding a coloured square (with probability `fill`)
//! or nothing, and the question `How many <colour> squares are there?<image>` (the board after
//! it); the answer is the count, the target completion `<answer>N</answer>`. Every (board, colour) pair is drawn once at most,
//! so no held-out question is a training one.

use std::collections::HashSet;
use std::io::Cursor;

use rein_core::SeededRng;
use rein_model::vision::IMAGE_TOKEN;
use rein_recipe::{SHAPE_COLORS, ShapesTask};

use crate::Example;
use crate::data::images::ImageSource;

/// Cell contents: `0` empty, `k` the task's `k`-th colour.
type Board = Vec<u8>;

/// The training and held-out examples of `task` drawn from `seed` (the recipe's): the images
/// in the rows, PNG-encoded.
pub fn generate_shapes_task(task: &ShapesTask, seed: u64) -> (Vec<Example>, Vec<Example>) {
    let mut rng = SeededRng::new(seed ^ 0x5A4E_5C0B);
    let cells = task.grid * task.grid;
    let colors = task.colors.len();
    // At most every (board, colour) pair once: (colours + 1)^cells boards, or fewer asked for.
    let possible = ((colors + 1) as f64).powi(cells as i32) * colors as f64;
    let wanted = ((task.train + task.test) as f64).min(possible) as usize;
    let mut seen: HashSet<(Board, usize)> = HashSet::with_capacity(wanted);
    let mut examples = Vec::with_capacity(wanted);
    while examples.len() < wanted {
        let board: Board = (0..cells)
            .map(|_| match rng.uniform() < task.fill {
                true => 1 + rng.below(colors as u64) as u8,
                false => 0,
            })
            .collect();
        let asked = rng.below(colors as u64) as usize;
        if !seen.insert((board.clone(), asked)) {
            continue;
        }
        let count = board.iter().filter(|&&c| usize::from(c) == asked + 1).count();
        examples.push(Example {
            // The question first: reading the board, the image tokens can already tell which
            // squares are the asked colour.
            prompt: format!("How many {} squares are there?{IMAGE_TOKEN}", task.colors[asked]),
            answer: Some(count.to_string()),
            completion: Some(format!("<answer>{count}</answer>")),
            metadata: String::new(),
            images: vec![ImageSource::Bytes(board_png(task, &board))],
        });
    }
    let test = examples.split_off(task.train.min(examples.len()));
    (examples, test)
}

/// `board` drawn as a PNG: white, each filled cell a square of its colour with a one-pixel
/// white margin (so that neighbouring squares stay apart).
fn board_png(task: &ShapesTask, board: &[u8]) -> Vec<u8> {
    let side = task.grid * task.cell;
    let mut pixels = image::RgbImage::from_pixel(side as u32, side as u32, image::Rgb([255, 255, 255]));
    for (i, &filled) in board.iter().enumerate() {
        if filled == 0 {
            continue;
        }
        let name = &task.colors[usize::from(filled) - 1];
        let rgb = (SHAPE_COLORS.iter())
            .find(|(known, _)| known == name)
            .map_or([0, 0, 0], |(_, rgb)| *rgb);
        let (x0, y0) = ((i % task.grid) * task.cell, (i / task.grid) * task.cell);
        for y in y0 + 1..y0 + task.cell - 1 {
            for x in x0 + 1..x0 + task.cell - 1 {
                pixels.put_pixel(x as u32, y as u32, image::Rgb(rgb));
            }
        }
    }
    let mut png = Vec::new();
    // Encoding a well-formed in-memory image into a Vec cannot fail.
    let _ = pixels.write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png);
    png
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> ShapesTask {
        toml::from_str("train = 50\ntest = 10").unwrap()
    }

    #[test]
    fn the_answer_counts_the_asked_colour_in_the_image() {
        let (train, test) = generate_shapes_task(&task(), 1);
        assert_eq!((train.len(), test.len()), (50, 10));
        for e in train.iter().chain(&test) {
            let ImageSource::Bytes(png) = &e.images[0] else {
                panic!("an encoded image")
            };
            let image = image::load_from_memory(png).unwrap().to_rgb8();
            assert_eq!(image.dimensions(), (24, 24));
            let color = e.prompt.split(' ').nth(2).unwrap();
            let (_, rgb) = SHAPE_COLORS.iter().find(|(name, _)| *name == color).unwrap();
            // A cell's centre pixel holds its square's colour.
            let counted = (0..9)
                .filter(|i| image.get_pixel((i % 3 * 8 + 4) as u32, (i / 3 * 8 + 4) as u32).0 == *rgb)
                .count();
            assert_eq!(e.answer.as_deref(), Some(counted.to_string().as_str()), "{}", e.prompt);
            assert_eq!(
                e.completion.as_deref(),
                Some(format!("<answer>{counted}</answer>").as_str())
            );
        }
    }

    #[test]
    fn no_held_out_question_is_a_training_one_and_the_seed_decides() {
        let (train, test) = generate_shapes_task(&task(), 1);
        let key = |e: &Example| (e.prompt.clone(), e.images.clone());
        let training: HashSet<_> = train.iter().map(key).collect();
        assert!(test.iter().all(|e| !training.contains(&key(e))));
        assert_eq!(generate_shapes_task(&task(), 1), (train.clone(), test));
        assert_ne!(generate_shapes_task(&task(), 2).0, train);
    }
}
