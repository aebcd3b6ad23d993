//! Where a figure comes from: the machine, its instruction set level, the date, the thread
//! count and rein's revision, printed before a suite runs and saved with its results, so a
//! figure copied elsewhere carries its provenance.

use std::process::Command;

/// The provenance of one benchmark run.
pub struct Machine {
    /// The CPU's model name (`/proc/cpuinfo`).
    pub cpu: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// The widest instruction set the CPU has and the one rein's kernels run.
    pub isa: String,
    /// UTC date, `YYYY-MM-DD`.
    pub date: String,
    /// Threads every side ran with.
    pub threads: usize,
    /// `git describe` of the checkout (`-dirty` with uncommitted changes).
    pub revision: String,
    /// `rustc --version`.
    pub rustc: String,
}

impl Machine {
    /// This machine, now.
    pub fn here(threads: usize) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .and_then(|r| r.split_once(':'))
                    .map(|(_, m)| m.trim())
            })
            .unwrap_or("unknown CPU")
            .to_string();
        let (widest, active) = (rein_kernels::Isa::detected(), rein_kernels::Isa::active());
        let isa = match widest == active {
            true => widest.name().to_uppercase(),
            false => format!("{} (kernels forced to {})", widest.name().to_uppercase(), active.name()),
        };
        Self {
            cpu,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            isa,
            date: today(),
            threads,
            revision: output("git", &["describe", "--always", "--dirty"]),
            rustc: output("rustc", &["--version"]),
        }
    }

    /// One line for the console.
    pub fn line(&self) -> String {
        format!(
            "{}: {} ({} logical CPUs, {}), {} threads per side, rein {}, {}",
            self.date, self.cpu, self.cpus, self.isa, self.threads, self.revision, self.rustc
        )
    }

    /// The same as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "date": self.date, "cpu": self.cpu, "cpus": self.cpus, "isa": self.isa,
            "threads": self.threads, "rein": self.revision, "rustc": self.rustc,
        })
    }
}

fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| format!("({program} unavailable)"))
}

/// Today's UTC date from the system clock (Howard Hinnant's days-to-civil algorithm).
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn today_is_a_date() {
        let d = super::today();
        assert_eq!(d.len(), 10, "{d}");
        assert!(d.starts_with("20"), "{d}");
    }
}
