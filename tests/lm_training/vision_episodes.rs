//! Multi-turn episodes that show a vision-language model images: a text environment opens each
//! episode with a view and answers each turn with a closer one. The episodes are played by the
//! sampler (its prompt's image prefilled, each reply's appended), then scored by the trainer
//! from the transcript's tokens and images alone; the two must agree on every token the model
//! sampled (1e-4), which holds only if both read the same images at the same tokens and
//! positions. A text model is refused such an environment by name.

use std::collections::HashMap;

use burn::backend::Flex;
use rein_core::{EpisodeStart, Image, Message, Opening, PluginError, Reply, TextEnv, Turn};
use rein_model::lm::{CausalLm, LmTokenizer, load};
use rein_posttrain::rollout::episodes::{Agent, play};
use rein_posttrain::{Prompt, PromptImageReader, TokenBatch, completion_log_probs};
use rein_sampler::GenerationConfig;

use super::*;

type B = Flex;

/// Opens with a view and answers each turn with a closer one, `views[turn]`; ends after the
/// third turn.
struct Views {
    views: Vec<Image>,
    turns: HashMap<u64, usize>,
}

impl Views {
    fn new() -> Self {
        let names = ["wide.png", "tall.png", "small_rgba.png"];
        let read = |name: &str| std::fs::read(root().join("tests/fixtures/vlm/images").join(name)).unwrap();
        Self {
            views: names.iter().map(|n| Image::new(read(n)).unwrap()).collect(),
            turns: HashMap::new(),
        }
    }
}

impl TextEnv for Views {
    fn name(&self) -> &str {
        "views"
    }

    fn reset(&mut self, starts: &[EpisodeStart]) -> Result<Vec<Opening>, PluginError> {
        Ok((starts.iter())
            .map(|start| {
                self.turns.insert(start.id, 0);
                Opening {
                    messages: vec![Message {
                        role: "user".into(),
                        content: format!("<image>{}", start.prompt),
                    }],
                    tools: Vec::new(),
                    images: vec![self.views[0].clone()],
                }
            })
            .collect())
    }

    fn step(&mut self, turns: &[Turn]) -> Result<Vec<Reply>, PluginError> {
        Ok((turns.iter())
            .map(|turn| {
                let taken = self.turns.get_mut(&turn.id).unwrap();
                *taken += 1;
                let done = *taken == 3;
                let view = self.views[(*taken).min(2)].clone();
                Reply {
                    messages: vec![Message {
                        role: "user".into(),
                        content: "Closer: <image> Where now?".into(),
                    }],
                    images: vec![view],
                    reward: done.then_some(1.0),
                    components: Vec::new(),
                    done,
                    state_key: None,
                }
            })
            .collect())
    }

    fn close(&mut self, ids: &[u64]) {
        for id in ids {
            self.turns.remove(id);
        }
    }
}

fn prompt(text: &str) -> Prompt {
    Prompt {
        text: text.into(),
        tokens: Vec::new(),
        answer: None,
        target: None,
        target_trained: None,
        metadata: String::new(),
        source: String::new(),
        images: Default::default(),
        image_files: Default::default(),
    }
}

fn agent(images: Option<PromptImageReader>) -> Agent {
    Agent {
        tools: Vec::new(),
        env: Some(Box::new(Views::new())),
        max_turns: 3,
        max_tokens: 4000,
        system_prompt: None,
        images,
    }
}

fn config() -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: 4,
        temperature: 1.0,
        n: 2,
        seed: 3,
        ..GenerationConfig::default()
    }
}

#[test]
fn the_trainer_reads_an_episodes_images_where_the_sampler_showed_them() {
    for family in ["qwen2_vl_model", "qwen2_5_vl_model"] {
        let dir = root().join("tests/fixtures/vlm").join(family);
        let device = Default::default();
        let model: CausalLm<B> = load(&dir, &device).unwrap();
        let tokenizer = LmTokenizer::load(&dir, &[]).unwrap();
        let reader = PromptImageReader::load(&dir, model.vision.as_ref().unwrap()).unwrap();
        let mut agent = agent(Some(reader));
        let prompts = [prompt("What is it?"), prompt("Which way?")];
        let chosen: Vec<&Prompt> = prompts.iter().collect();
        let episodes = play(&model, &tokenizer, &mut agent, &chosen, &config(), 0, &device).unwrap();
        assert_eq!(episodes.len(), 4);

        let rows: Vec<(&[u32], &[u32])> = (episodes.iter())
            .map(|e| e.transcript.tokens().split_at(e.transcript.prompt_len()))
            .collect();
        let mut batch = TokenBatch::new(&rows, tokenizer.pad_id().unwrap_or(0));
        for (row, episode) in episodes.iter().enumerate() {
            let transcript = &episode.transcript;
            assert_eq!(
                episode.turns, 3,
                "{family}: the environment ends episodes after 3 turns"
            );
            // The opening's view, and one with each of the two replies before the last turn.
            assert_eq!(transcript.images().len(), 3, "{family}");
            batch.keep_in_loss(row, &transcript.sampled()[transcript.prompt_len()..]);
        }
        batch.images = episodes.iter().map(|e| e.transcript.images().into()).collect();
        let (log_probs, _) = completion_log_probs(&model, &batch, 1.0, false, &device);
        let log_probs: Vec<f32> = log_probs.into_data().to_vec().unwrap();
        let c = batch.completion_width;
        for (row, episode) in episodes.iter().enumerate() {
            let transcript = &episode.transcript;
            let at = transcript.prompt_len();
            let sampled = (at..transcript.tokens().len()).filter(|&i| transcript.sampled()[i]);
            for i in sampled {
                let (trained, sampler) = (log_probs[row * c + i - at], transcript.log_probs()[i]);
                assert!(
                    (trained - sampler).abs() < 1e-4,
                    "{family}: episode {row}, token {i}: the trainer's {trained}, the sampler's {sampler}"
                );
            }
        }
    }
}

#[test]
fn a_text_model_is_refused_an_environment_that_shows_images() {
    // The opening's image is refused before the model runs: any text model will do.
    let tokenizer = LmTokenizer::load(&root().join("recipes/assets/arithmetic-tokenizer"), &[]).unwrap();
    let model: CausalLm<B> = load(&root().join("tests/fixtures/lm/llama"), &Default::default()).unwrap();
    let mut agent = agent(None);
    let prompts = [prompt("What is it?")];
    let chosen: Vec<&Prompt> = prompts.iter().collect();
    let error = play(
        &model,
        &tokenizer,
        &mut agent,
        &chosen,
        &config(),
        0,
        &Default::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        error.contains("text environment `views`: the opening of episode 0 cannot be shown")
            && error.contains("reads no images"),
        "{error}"
    );
}

/// An SFT row whose target is a conversation (a tool call, its result, the answer) and whose
/// prompt has an image becomes the transcript an episode would: the opening shows the image,
/// the model's turns are trained on and the tool's result is not, and the trainer reads the
/// image where the opening shows it.
#[test]
fn a_conversational_target_under_an_image_is_the_transcript_its_episode_would_be() {
    let dir = root().join("tests/fixtures/vlm/qwen2_vl_model");
    let device = Default::default();
    let model: CausalLm<B> = load(&dir, &device).unwrap();
    let tokenizer = LmTokenizer::load(&dir, &[]).unwrap();
    let reader = PromptImageReader::load(&dir, model.vision.as_ref().unwrap()).unwrap();
    let trace = serde_json::json!([
        {"role": "assistant", "content": "<tool_call>{\"name\": \"zoom\"}</tool_call>"},
        {"role": "tool", "content": "two squares"},
        {"role": "assistant", "content": "<answer>2</answer>"},
    ]);
    let example = rein_posttrain::Example {
        prompt: "How many?".into(),
        answer: Some("2".into()),
        completion: Some(trace.to_string()),
        metadata: String::new(),
        images: vec![rein_posttrain::ImageSource::Path(
            root().join("tests/fixtures/vlm/images/wide.png"),
        )],
    };
    let data: rein_recipe::DataSection = serde_json::from_value(serde_json::json!({})).unwrap();
    let prompt =
        rein_posttrain::prepare(std::slice::from_ref(&example), &tokenizer, &data, &[], Some(&reader)).unwrap();
    let prompt = &prompt[0];
    assert_eq!(prompt.images.len(), 1);
    assert_eq!(prompt.image_files.len(), 1);
    let trained = prompt.target_trained.as_ref().unwrap();
    assert!(
        trained.contains(&true) && trained.contains(&false),
        "the tool's result is masked"
    );
    let image_token = model.vision.as_ref().unwrap().image_token_id();
    let features = model
        .vision
        .as_ref()
        .unwrap()
        .image_features(prompt.images.iter(), &device);
    let image_tokens = prompt.tokens.iter().filter(|&&t| t == image_token).count();
    assert_eq!(image_tokens, features.dims()[0], "the opening shows the image");

    let target = prompt.target.as_ref().unwrap();
    let mut batch = TokenBatch::new(&[(&prompt.tokens, target)], 0);
    batch.keep_in_loss(0, trained);
    batch.images = vec![prompt.images.clone()];
    let (log_probs, _) = completion_log_probs(&model, &batch, 1.0, false, &device);
    let log_probs: Vec<f32> = log_probs.into_data().to_vec().unwrap();
    assert!(log_probs.iter().all(|lp| lp.is_finite() && *lp <= 0.0));

    // Without an image reader the row is refused, naming it.
    let error = rein_posttrain::prepare(&[example], &tokenizer, &data, &[], None).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("row 1: the row has images, but the model reads no images"),
        "{error}"
    );
}
