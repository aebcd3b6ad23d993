//! Images through the sandbox: a reward that asks for the prompt's images receives them (and
//! one that does not, none), a tool's images are checked against their media type and counted
//! in the output limit, and a 2 GiB image never leaves the guest.

use rein_core::{Group, Image, RewardFn, Tool, ToolErrorKind};
use rein_pdk::image::RgbPixels;
use rein_plugin::SandboxLimits;

use super::{common, quick_limits};

/// A white 12 × 12 board PNG with a red square at each of `corners` (`(x, y)` of 4 × 4 squares).
fn board(corners: &[(u32, u32)]) -> Image {
    let mut rgb = vec![255u8; 12 * 12 * 3];
    for &(x0, y0) in corners {
        for y in y0..y0 + 4 {
            for x in x0..x0 + 4 {
                let at = ((y * 12 + x) * 3) as usize;
                rgb[at..at + 3].copy_from_slice(&[220, 30, 30]);
            }
        }
    }
    let pixels = RgbPixels {
        width: 12,
        height: 12,
        rgb,
    };
    let png = rein_pdk::Image::png_from_rgb(&pixels).unwrap();
    Image::with_media_type(&png.media_type, png.data).unwrap()
}

#[test]
fn a_reward_that_asks_for_the_prompts_images_scores_what_they_show() {
    let plugin = common::load("count-shapes");
    assert!(plugin.info().reads_images && !plugin.info().reads_tokens);
    assert!(!common::load("math-answer").info().reads_images);
    let mut reward = plugin.reward("{}").unwrap();
    assert!(reward.reads_images());
    let group = |images: Vec<Image>| Group {
        prompt: "How many red squares are there?<image>".into(),
        completions: vec!["<answer>2</answer>".into(), "<answer>3</answer>".into()],
        images,
        ..Group::default()
    };
    let groups = [
        group(vec![board(&[(1, 1), (7, 7)])]),
        group(vec![board(&[(1, 1), (7, 1), (1, 7)])]),
        group(Vec::new()),
    ];
    let scores = reward.score(&groups).unwrap();
    let values: Vec<Vec<Option<f64>>> = (scores.iter()).map(|g| g.iter().map(|s| s.score).collect()).collect();
    assert_eq!(
        values,
        [vec![Some(1.0), Some(0.0)], vec![Some(0.0), Some(1.0)], vec![None, None]]
    );
}

#[test]
fn a_tools_images_are_checked_and_counted_in_the_output_limit() {
    let plugin = common::load_with(&common::test_plugin_path("hostile-tool"), SandboxLimits::default());
    let mut tool = plugin.tool("{}").unwrap();
    let error = tool.call(r#"{"attack": "oversized-image"}"#).unwrap_err();
    assert_eq!(error.kind, ToolErrorKind::Host);
    assert!(
        error
            .message
            .contains("of output (text and images), over the limit of 67108864 bytes (`max_output_mib`)"),
        "{}",
        error.message
    );
    let error = tool.call(r#"{"attack": "mislabelled-image"}"#).unwrap_err();
    assert!(
        error.message.contains("image 0 of the output")
            && error
                .message
                .contains("said to be image/jpeg, but its bytes are image/png"),
        "{}",
        error.message
    );
    assert_eq!(tool.call(r#"{"text": "still here"}"#), Ok("still here".into()));

    let mut tool = common::load_with(&common::test_plugin_path("hostile-tool"), quick_limits())
        .tool("{}")
        .unwrap();
    let error = tool.call(r#"{"attack": "two-gib-image"}"#).unwrap_err();
    assert_eq!(error.kind, ToolErrorKind::Limit);
    assert!(error.message.contains("memory limit of 64 MiB"), "{}", error.message);
    assert_eq!(tool.call(r#"{"text": "still here"}"#), Ok("still here".into()));
}

/// `count-shapes` reads every board of the generated shapes task as the generator drew it: the
/// right count scores 1 and a wrong one 0, on every example of several boards' settings.
#[test]
fn the_image_verifier_agrees_with_the_shapes_task_generator() {
    let mut reward = common::load("count-shapes").reward(r#"{"extract": "answer"}"#).unwrap();
    let task = |grid, cell, colors: &[&str], fill, train, test| rein_recipe::ShapesTask {
        grid,
        cell,
        colors: colors.iter().map(|c| c.to_string()).collect(),
        fill,
        train,
        test,
    };
    for task in [
        task(4, 6, &["red"], 0.5, 150, 10),
        task(5, 8, &["red", "blue", "black"], 0.8, 150, 10),
        task(3, 4, &["green", "yellow"], 0.6, 60, 0),
    ] {
        let (train, test) = rein_posttrain::generate_shapes_task(&task, 7);
        let groups: Vec<Group> = (train.iter().chain(&test))
            .map(|e| {
                let answer: usize = e.answer.as_deref().unwrap().parse().unwrap();
                let rein_posttrain::ImageSource::Bytes(png) = &e.images[0] else {
                    panic!("the generator's images are encoded")
                };
                Group {
                    prompt: e.prompt.clone(),
                    completions: vec![
                        format!("<answer>{answer}</answer>"),
                        format!("<answer>{}</answer>", answer + 1),
                    ],
                    images: vec![Image::new(png.clone()).unwrap()],
                    ..Group::default()
                }
            })
            .collect();
        for (group, scores) in groups.iter().zip(reward.score(&groups).unwrap()) {
            let values: Vec<_> = scores.iter().map(|s| s.score).collect();
            assert_eq!(values, [Some(1.0), Some(0.0)], "{task:?}: {}", group.prompt);
        }
    }
}
