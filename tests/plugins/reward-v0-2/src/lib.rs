//! A reward plugin built against a future `rein:plugin@0.2.0` interface: loading it must fail
//! with a typed error naming both versions.

wit_bindgen::generate!({
    inline: "
        package rein:plugin@0.2.0;

        interface reward-api {
            score-all: func(completions: list<string>) -> list<f64>;
        }

        world reward {
            export reward-api;
        }
    ",
    world: "rein:plugin/reward@0.2.0",
});

struct Future;

impl exports::rein::plugin::reward_api::Guest for Future {
    fn score_all(completions: Vec<String>) -> Vec<f64> {
        completions.iter().map(|c| c.len() as f64).collect()
    }
}

export!(Future);
