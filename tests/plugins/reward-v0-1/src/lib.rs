//! A reward plugin built against the previous `rein:plugin@0.1.0` interface (reward-api's
//! `score` took the same groups; 0.2.0 moved `component` into `types` and added the tool and
//! text-env worlds): loading it must fail with a typed error naming both versions.

wit_bindgen::generate!({
    inline: "
        package rein:plugin@0.1.0;

        interface reward-api {
            score-all: func(completions: list<string>) -> list<f64>;
        }

        world reward {
            export reward-api;
        }
    ",
    world: "rein:plugin/reward@0.1.0",
});

struct Old;

impl exports::rein::plugin::reward_api::Guest for Old {
    fn score_all(completions: Vec<String>) -> Vec<f64> {
        completions.iter().map(|c| c.len() as f64).collect()
    }
}

export!(Old);
