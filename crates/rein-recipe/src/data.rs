//! What a recipe's `[data]` section describes: the columns of a dataset, or a task rein
//! generates itself (the generator lives in `rein-train`).

use serde::{Deserialize, Serialize};

use crate::error::{Broken, broken};

/// Which columns hold what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Fields {
    /// The prompt column.
    pub prompt: String,
    /// The reference-answer column.
    pub answer: String,
    /// The target-completion column.
    pub completion: String,
    /// The preferred completion's column (preference data).
    pub chosen: String,
    /// The other completion's column (preference data).
    pub rejected: String,
    /// An optional column of how much `chosen` is preferred (reward-model training).
    pub margin: String,
    /// Whether `completion` is desirable (`true`) or not, in unpaired preference data (KTO).
    pub label: String,
    /// The steps column of step-labelled rows (process reward models): a list of texts.
    pub completions: String,
    /// The column of a label per step (`true`: the step is right).
    pub labels: String,
    /// The column naming each row's data source (verl's `data_source`), which a
    /// `[curriculum] kind = "ucb"` draws between; rows without it form one unnamed source. It
    /// stays in the metadata reward plugins see.
    pub source: String,
    /// The column of a row's images (a vision-language model's prompts): a list of paths
    /// relative to the data file, or of `{"path", "bytes"}` objects with the bytes in base64, as
    /// Hugging Face datasets store an `Image` column in Parquet.
    pub images: String,
}

impl Default for Fields {
    fn default() -> Self {
        Self {
            prompt: "prompt".into(),
            answer: "answer".into(),
            completion: "completion".into(),
            chosen: "chosen".into(),
            rejected: "rejected".into(),
            margin: "margin".into(),
            label: "label".into(),
            completions: "completions".into(),
            labels: "labels".into(),
            source: "data_source".into(),
            images: "images".into(),
        }
    }
}

/// `What is a ○ b?` for two operands up to `max_operand` and operators from `ops`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArithmeticTask {
    /// Smallest operand.
    #[serde(default)]
    pub min_operand: u32,
    /// Largest operand (operands are drawn from `min_operand..=max_operand`).
    #[serde(default = "defaults::max_operand")]
    pub max_operand: u32,
    /// Operators: any of `+`, `-`, `*`.
    #[serde(default = "defaults::ops")]
    pub ops: Vec<String>,
    /// Operand lengths in digits, for a task of mixed difficulty: each problem draws one of
    /// them uniformly, then both operands with that many digits (within
    /// `min_operand..=max_operand`), and its row's `data_source` is `"<d>-digit"`. Empty: both
    /// operands from the whole range, and no source.
    #[serde(default)]
    pub digits: Vec<u32>,
    /// Training examples.
    #[serde(default = "defaults::train")]
    pub train: usize,
    /// Held-out examples (never in the training split).
    #[serde(default = "defaults::test")]
    pub test: usize,
    /// The worked solutions SFT learns from.
    #[serde(default)]
    pub solution: Solution,
    /// With `solution = "calculator"`: the share of solutions that call the tool; the others
    /// answer at once (what the model must then do in its head).
    #[serde(default = "defaults::tool_share")]
    pub tool_share: f64,
}

/// How a generated arithmetic problem's target completion solves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Solution {
    /// A digit-by-digit scratchpad in `<think>`, then `<answer>`.
    #[default]
    Scratchpad,
    /// A call to the `calculator` tool, its result, then `<answer>`: a multi-turn trace.
    Calculator,
    /// The answer alone, `<answer>…</answer>`: what a pretrained model computes in its head.
    Answer,
}

impl ArithmeticTask {
    /// Checks the settings, naming the key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if let Some(op) = self.ops.iter().find(|op| !["+", "-", "*"].contains(&op.as_str())) {
            return Err(("ops".into(), format!("`{op}` is not one of +, -, *")));
        }
        if self.ops.is_empty() {
            return Err(("ops".into(), "needs at least one operator".into()));
        }
        if !(0.0..=1.0).contains(&self.tool_share) {
            return Err((
                "tool_share".into(),
                format!("must be in [0, 1], got {}", self.tool_share),
            ));
        }
        if self.min_operand > self.max_operand {
            return Err((
                "min_operand".into(),
                format!("{} is above max_operand {}", self.min_operand, self.max_operand),
            ));
        }
        if let Some(d) = self.digits.iter().find(|&&d| !(1..=9).contains(&d)) {
            return Err(("digits".into(), format!("{d} digits: lengths go from 1 to 9")));
        }
        let mut lengths = std::collections::BTreeSet::new();
        if let Some(d) = self.digits.iter().find(|&&d| !lengths.insert(d)) {
            return Err(("digits".into(), format!("lists {d} twice")));
        }
        let ranges = self.operand_ranges();
        if let Some(source) = ranges.iter().find(|r| r.low > r.high).and_then(|r| r.source.clone()) {
            return Err((
                "digits".into(),
                format!(
                    "no {source} operand lies in min_operand..=max_operand ({}..={})",
                    self.min_operand, self.max_operand
                ),
            ));
        }
        let distinct: u64 = (ranges.iter())
            .flat_map(|r| {
                let operands = u64::from(r.high - r.low) + 1;
                self.ops.iter().map(move |op| {
                    if op == "-" {
                        operands * (operands + 1) / 2
                    } else {
                        operands * operands
                    }
                })
            })
            .sum();
        if (self.train + self.test) as u64 > distinct {
            return Err((
                "train".into(),
                format!(
                    "{} + {} examples asked, but only {distinct} distinct problems exist",
                    self.train, self.test
                ),
            ));
        }
        Ok(())
    }
}

/// A visual task for vision-language models: `How many red squares?` about an image of a
/// `grid × grid` board whose cells each hold a square of one of `colors` (with probability
/// `fill`) or nothing; the answer is the count of the asked colour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShapesTask {
    /// Cells along each side of the board.
    #[serde(default = "defaults::grid")]
    pub grid: usize,
    /// The side of a cell in pixels (the image is `grid · cell` pixels square).
    #[serde(default = "defaults::cell")]
    pub cell: usize,
    /// The colours squares may have (`red`, `green`, `blue`, `yellow`, `black`); questions
    /// ask about one of them.
    #[serde(default = "defaults::colors")]
    pub colors: Vec<String>,
    /// The probability that a cell holds a square.
    #[serde(default = "defaults::fill")]
    pub fill: f64,
    /// Training examples.
    #[serde(default = "defaults::train")]
    pub train: usize,
    /// Held-out examples (never in the training split).
    #[serde(default = "defaults::test")]
    pub test: usize,
}

/// The colours a [`ShapesTask`] draws squares in, as 8-bit RGB.
pub const SHAPE_COLORS: [(&str, [u8; 3]); 5] = [
    ("red", [220, 30, 30]),
    ("green", [30, 170, 60]),
    ("blue", [30, 60, 220]),
    ("yellow", [235, 200, 20]),
    ("black", [0, 0, 0]),
];

impl ShapesTask {
    /// Checks the settings, naming the key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if !(1..=16).contains(&self.grid) {
            return Err(("grid".into(), format!("{} cells a side: 1 to 16", self.grid)));
        }
        if !(2..=64).contains(&self.cell) {
            return Err(("cell".into(), format!("{} pixels a cell: 2 to 64", self.cell)));
        }
        if self.colors.is_empty() {
            return Err(("colors".into(), "needs at least one colour".into()));
        }
        if let Some(c) = self
            .colors
            .iter()
            .find(|c| !SHAPE_COLORS.iter().any(|(name, _)| name == c))
        {
            let known: Vec<&str> = SHAPE_COLORS.iter().map(|(name, _)| *name).collect();
            return Err(("colors".into(), format!("`{c}` is not one of {}", known.join(", "))));
        }
        if !(0.0..=1.0).contains(&self.fill) {
            return Err(("fill".into(), format!("must be in [0, 1], got {}", self.fill)));
        }
        Ok(())
    }
}

/// The operands of one difficulty of an [`ArithmeticTask`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperandRange {
    /// Smallest operand.
    pub low: u32,
    /// Largest operand.
    pub high: u32,
    /// The rows' `data_source` (`"2-digit"`); `None` without `digits`.
    pub source: Option<String>,
}

impl ArithmeticTask {
    /// The ranges problems draw their operands from: one per digit length, or the whole range.
    pub fn operand_ranges(&self) -> Vec<OperandRange> {
        if self.digits.is_empty() {
            return vec![OperandRange {
                low: self.min_operand,
                high: self.max_operand,
                source: None,
            }];
        }
        (self.digits.iter())
            .map(|&d| {
                let power = |e: u32| 10u64.saturating_pow(e);
                let first = if d <= 1 { 0 } else { power(d - 1) };
                OperandRange {
                    low: u32::try_from(first).unwrap_or(u32::MAX).max(self.min_operand),
                    high: u32::try_from(power(d) - 1).unwrap_or(u32::MAX).min(self.max_operand),
                    source: Some(format!("{d}-digit")),
                }
            })
            .collect()
    }
}

mod defaults {
    pub fn tool_share() -> f64 {
        1.0
    }
    pub fn grid() -> usize {
        3
    }
    pub fn cell() -> usize {
        8
    }
    pub fn colors() -> Vec<String> {
        vec!["red".into(), "blue".into()]
    }
    pub fn fill() -> f64 {
        0.6
    }
    pub fn max_operand() -> u32 {
        99
    }
    pub fn ops() -> Vec<String> {
        vec!["+".into(), "-".into()]
    }
    pub fn train() -> usize {
        20_000
    }
    pub fn test() -> usize {
        500
    }
}
/// Where a language-model recipe's prompts come from (`[data]`'s `task` and `train`), checked
/// before any file is read: a generated task's settings, a training split named, and for the
/// algorithms that learn from preference pairs (`learns_from_pairs`), a task that can make them.
pub(crate) fn check_data(
    (task, shapes): (Option<&ArithmeticTask>, Option<&ShapesTask>),
    train: Option<&str>,
    learns_from_pairs: bool,
) -> Result<(), Broken> {
    if let Some(shapes) = shapes {
        if task.is_some() || train.is_some() {
            return Err(broken(
                "data.shapes_task",
                "generates the data on its own: set it, data.task or data.train, not two of them",
            ));
        }
        if learns_from_pairs {
            return Err(broken("data.shapes_task", "makes no preference pairs or step labels"));
        }
        return (shapes.validate()).map_err(|(key, message)| broken(&format!("data.shapes_task.{key}"), message));
    }
    let Some(task) = task else {
        return match train {
            Some(_) => Ok(()),
            None => Err(broken(
                "data",
                "set data.train (a .jsonl or .parquet file), data.task or data.shapes_task",
            )),
        };
    };
    task.validate()
        .map_err(|(key, message)| broken(&format!("data.task.{key}"), message))?;
    // Generated pairs: each problem's worked solution against a slipped one.
    if learns_from_pairs && (task.ops.iter().any(|op| op == "*") || task.solution != Solution::Scratchpad) {
        return Err(broken(
            "data.task",
            "generated preference pairs and step labels slip one step of a worked + or − solution: \
             use ops from [\"+\", \"-\"] and solution = \"scratchpad\"",
        ));
    }
    Ok(())
}
