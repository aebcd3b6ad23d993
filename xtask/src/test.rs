//! `cargo xtask test`.

use clap::Args;

use crate::build_plugins::BuildPlugins;
use crate::workspace::{cargo, root, run};

#[derive(Args)]
pub(crate) struct Test {
    /// Extra arguments for `cargo test` on the host workspace (e.g. a test name filter).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

impl Test {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        BuildPlugins { no_test_plugins: false }.run()?;
        eprintln!("testing plugin logic natively (plugins/)");
        run(cargo()
            .args(["test", "--quiet", "--manifest-path"])
            .arg(root().join("plugins/Cargo.toml")))?;
        eprintln!("testing the workspace");
        run(cargo()
            .args(["test", "--workspace", "--quiet"])
            .args(&self.args)
            .current_dir(root()))
    }
}
