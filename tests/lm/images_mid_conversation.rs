//! Images shown in the middle of a conversation (a tool's crop, an environment's new view):
//! [`Session::append_with_images`] reads them once into each sequence's cache, and everything
//! the session computes after must equal encoding the whole transcript at once with all its
//! images ([`CausalLm::prefill_with_images`], itself proven against transformers in
//! [`super::vision`] and [`super::qwen2_vl`]) — for Idefics3, and for Qwen2-VL and Qwen2.5-VL,
//! whose appended tokens take multimodal positions counted on from where each sequence stands.

use rein_model::vision::{ImageLimits, ImageProcessor, ProcessedImage, decode_rgb};
use rein_sampler::{AfterTurn, Prefill, PromptImages, Session, TurnOutput, prompt_seed};

use super::*;

fn vlm_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/vlm")
}

/// A vision-language model with what it reads text and images with.
struct Vlm {
    model: CausalLm<B>,
    processor: ImageProcessor,
    tokenizer: LmTokenizer,
}

impl Vlm {
    fn load(dir: &str) -> Self {
        let dir = vlm_fixtures().join(dir);
        let model = load::<B>(&dir, &Default::default()).unwrap();
        let processor = ImageProcessor::load(&dir, model.vision.as_ref().unwrap()).unwrap();
        let tokenizer = LmTokenizer::load(&dir, &[]).unwrap();
        Self {
            model,
            processor,
            tokenizer,
        }
    }

    fn image(&self, name: &str) -> ProcessedImage {
        let bytes = std::fs::read(vlm_fixtures().join("images").join(name)).unwrap();
        self.processor
            .process(&decode_rgb(&bytes, ImageLimits::default()).unwrap())
            .unwrap()
    }

    /// The ids of `text`, its `<image>` markers expanded for `images`.
    fn ids(&self, text: &str, images: &[ProcessedImage]) -> Vec<u32> {
        let expanded = self.processor.expand_prompt(text, images).unwrap();
        self.tokenizer.encode(&expanded).unwrap()
    }

    /// The logits of every position of `tokens` showing `images`, encoded at once, `[seq × vocab]`.
    fn whole(&self, tokens: &[u32], images: &[ProcessedImage]) -> Vec<f32> {
        let device = Default::default();
        let hidden = (self.model.prefill_with_images(tokens, images, None, &device))
            .unwrap()
            .hidden;
        self.model.logits(hidden).into_data().to_vec().unwrap()
    }

    fn image_token(&self) -> u32 {
        self.model.vision.as_ref().unwrap().image_token_id()
    }
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_z = f64::from(max) + row.iter().map(|&z| f64::from(z - max).exp()).sum::<f64>().ln();
    row.iter().map(|&z| f64::from(z) - log_z).collect()
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Two prompts (one showing an image, one text), two sequences each; a sampled turn; then
/// additions that show one image, none, one, and two — then a second turn. After the
/// additions each sequence's next-token logits, and the second turn's log-probabilities,
/// equal the whole transcript's (1e-4). An addition whose image tokens do not match its
/// images is refused naming the sequence, and leaves the session as it was.
fn appended_images_read_as_the_whole_transcript_does(family: &str) {
    let vlm = Vlm::load(family);
    let device = Default::default();
    let vocab = vlm.model.config().vocab_size;
    let prompt_images = [vec![vlm.image("wide.png")], Vec::new()];
    let prompts = [
        vlm.ids("<image>What is it?", &prompt_images[0]),
        vlm.ids("Say something.", &[]),
    ];
    let config = GenerationConfig {
        max_new_tokens: 3,
        temperature: 1.0,
        n: 2,
        seed: 7,
        ..GenerationConfig::default()
    };
    let seeds: Vec<u64> = (0..2).map(|p| prompt_seed(config.seed, p)).collect();
    let shown: Vec<&[ProcessedImage]> = prompt_images.iter().map(Vec::as_slice).collect();
    let images = PromptImages::of_prompts(vlm.model.vision.as_ref(), &prompts, &shown, &device)
        .unwrap()
        .unwrap();
    let mut session: Session<'_, B> = Prefill::new(&vlm.model, &prompts, &seeds, &config, 0, usize::MAX, &device)
        .with_images(images)
        .unwrap()
        .into_session();
    let mut transcripts: Vec<Vec<u32>> = (0..4).map(|s| prompts[s / 2].clone()).collect();
    let mut images: Vec<Vec<ProcessedImage>> = (0..4).map(|s| prompt_images[s / 2].clone()).collect();
    let take = |transcripts: &mut Vec<Vec<u32>>, turn: &[TurnOutput]| {
        for (s, out) in turn.iter().enumerate() {
            // The model's own image tokens would be text to the session; the whole encoding
            // here reads every image token as an image, so the seed keeps them out.
            assert!(
                !out.tokens.contains(&vlm.image_token()),
                "{family}: sequence {s} sampled an image token"
            );
            transcripts[s].extend(&out.tokens);
        }
    };
    let turn = session.turn(&[0, 1, 2, 3], AfterTurn::Keep, &mut |_, _| false);
    take(&mut transcripts, &turn);

    let added_images = [
        vec![vlm.image("tall.png")],
        Vec::new(),
        vec![vlm.image("small_rgba.png")],
        vec![vlm.image("grey.png"), vlm.image("wide.png")],
    ];
    let texts = ["Closer: <image>", "Go on.", "<image> and then", "<image> or <image>?"];
    let additions: Vec<(usize, Vec<u32>)> = (0..4).map(|s| (s, vlm.ids(texts[s], &added_images[s]))).collect();
    let refs: Vec<&[ProcessedImage]> = added_images.iter().map(Vec::as_slice).collect();

    // Sequence 2's tokens without its image: refused, nothing appended.
    let error = session
        .append_with_images(&additions, &[refs[0], refs[1], &[], refs[3]])
        .unwrap_err();
    assert!(error.starts_with("sequence 2: "), "{family}: {error}");
    session.append_with_images(&additions, &refs).unwrap();
    for (s, tokens) in &additions {
        transcripts[*s].extend(tokens);
        images[*s].extend(added_images[*s].iter().cloned());
    }
    for s in 0..4 {
        let whole = vlm.whole(&transcripts[s], &images[s]);
        let last = &whole[whole.len() - vocab..];
        let difference = worst(session.next_logits(s).unwrap(), last);
        assert!(
            difference < 1e-4,
            "{family}: sequence {s}'s logits after the addition: {difference}"
        );
    }

    // Decoding goes on from where each addition's positions end.
    let turn = session.turn(&[0, 1, 2, 3], AfterTurn::Keep, &mut |_, _| false);
    let before: Vec<usize> = transcripts.iter().map(Vec::len).collect();
    take(&mut transcripts, &turn);
    for (s, out) in turn.iter().enumerate() {
        let whole = vlm.whole(&transcripts[s], &images[s]);
        for (k, (&token, &logprob)) in out.tokens.iter().zip(&out.logprobs).enumerate() {
            let at = before[s] + k - 1;
            let want = log_softmax(&whole[at * vocab..(at + 1) * vocab])[token as usize];
            let difference = (f64::from(logprob) - want).abs();
            assert!(
                difference < 1e-4,
                "{family}: sequence {s}, token {k} of the second turn: {difference}"
            );
        }
    }
}

#[test]
fn images_appended_to_an_idefics3_conversation_read_as_the_whole_transcript_does() {
    appended_images_read_as_the_whole_transcript_does("idefics3");
}

#[test]
fn images_appended_to_a_qwen2_vl_conversation_take_their_multimodal_positions() {
    appended_images_read_as_the_whole_transcript_does("qwen2_vl_model");
}

#[test]
fn images_appended_to_a_qwen2_5_vl_conversation_take_their_multimodal_positions() {
    appended_images_read_as_the_whole_transcript_does("qwen2_5_vl_model");
}
