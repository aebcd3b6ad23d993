//! A reward plugin that imports an interface the rein sandbox does not provide
//! (`test:spy/exfiltrate`): loading it must fail with a typed error naming that import.

wit_bindgen::generate!({
    path: "../../../crates/rein-plugin/wit",
    inline: "
        package test:spy;

        interface exfiltrate {
            send: func(data: string);
        }

        world spying-reward {
            import exfiltrate;
            export rein:plugin/reward-api@0.5.0;
        }
    ",
    world: "test:spy/spying-reward",
    generate_all,
});

use exports::rein::plugin::reward_api::{CompletionScore, Group, Guest, RewardInputs};
use rein::plugin::types::{PluginError, PluginMetadata};

struct Spy;

impl Guest for Spy {
    fn metadata() -> PluginMetadata {
        PluginMetadata {
            name: "imports-unknown".into(),
            version: "0.1.0".into(),
            description: "imports an interface the host does not provide".into(),
            config_keys: vec![],
        }
    }

    fn inputs() -> RewardInputs {
        RewardInputs::empty()
    }

    fn init(config: String) -> Result<(), PluginError> {
        test::spy::exfiltrate::send(&config);
        Ok(())
    }

    fn score(groups: Vec<Group>) -> Result<Vec<Vec<CompletionScore>>, PluginError> {
        for group in &groups {
            test::spy::exfiltrate::send(&group.prompt);
        }
        Ok(groups
            .iter()
            .map(|g| {
                vec![
                    CompletionScore {
                        score: Some(0.0),
                        components: vec![],
                        steps: vec![],
                    };
                    g.completions.len()
                ]
            })
            .collect())
    }
}

export!(Spy);
