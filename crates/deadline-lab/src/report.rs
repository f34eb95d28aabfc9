//! What an experiment prints: one JSON object, or a human table.

use serde_json::Value;

/// A typed result as the JSON printed with `--json` (and read back by the
/// report and the tests into the same type). A result that cannot be
/// serialised (a map with non-string keys) is reported as `{"error": …}`.
pub fn to_json<T: serde::Serialize>(result: &T) -> Value {
    serde_json::to_value(result).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
}

/// The result of one experiment or benchmark.
#[derive(Debug)]
pub struct Outcome {
    /// The title of the human table.
    pub title: String,
    /// The machine-readable result (printed alone with `--json`).
    pub json: Value,
    /// Column names of the human table.
    pub columns: Vec<&'static str>,
    /// Rows of the human table.
    pub rows: Vec<Vec<String>>,
    /// Lines printed under the table.
    pub notes: Vec<String>,
}

impl Outcome {
    /// Renders the table as markdown, as `docs/` quotes it (`--markdown`):
    /// the same columns and cells, without the notes.
    pub fn markdown(&self) -> String {
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        let mut out = line(
            &self
                .columns
                .iter()
                .map(|c| (*c).to_owned())
                .collect::<Vec<_>>(),
        );
        out += &line(&vec!["---".to_owned(); self.columns.len()]);
        for row in &self.rows {
            out += &line(
                &row.iter()
                    .map(|c| c.replace('|', "\\|"))
                    .collect::<Vec<_>>(),
            );
        }
        out
    }

    /// Renders the human table.
    pub fn table(&self) -> String {
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                    .chain([self.columns[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<String>| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            format!("  {}\n", padded.join("  ").trim_end())
        };
        let mut out = format!("{}\n", self.title);
        out += &line(self.columns.iter().map(|c| (*c).to_owned()).collect());
        out += &line(widths.iter().map(|w| "-".repeat(*w)).collect());
        for row in &self.rows {
            out += &line(row.clone());
        }
        for note in &self.notes {
            out += &format!("  {note}\n");
        }
        out
    }
}

/// The gRPC name of a status code, as in the spec (`DEADLINE_EXCEEDED`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Milliseconds with one decimal.
pub fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// The `q`-quantile (0..=1) of sorted values.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}
