//! The Python peers in `benches/peers/`, run with `.venv`'s interpreter in the same invocation
//! as rein's figure (see benches/peers/README.md).

use std::ffi::OsStr;
use std::path::Path;

/// Runs `benches/peers/<script>` with `args` and returns what it printed; `None`, saying why,
/// when there is no `.venv` or the script fails (the bench then shows rein's figure alone).
pub fn run(script: &str, args: impl IntoIterator<Item = impl AsRef<OsStr>>) -> Option<String> {
    let python = Path::new(".venv/bin/python");
    if !python.exists() {
        println!("(no .venv: skipping the peer {script}; see benches/peers/README.md)");
        return None;
    }
    let out = match std::process::Command::new(python)
        .arg(Path::new("benches/peers").join(script))
        .args(args)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            println!("(cannot start the peer {script}: {e})");
            return None;
        }
    };
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("(peer {script} failed: {})", stderr.lines().last().unwrap_or(""));
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}
