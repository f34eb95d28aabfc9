//! What each service of a seed system wrote in its journal
//! ([`Journal`](crate::systems::trace::Journal)), grouped by hop: its budget
//! on entry, what it handed on, how its own work ended.

use serde::{Deserialize, Serialize};

use crate::pb::Trace;

/// A journal's microseconds as milliseconds with one decimal; `None` for
/// the journal's -1 (no deadline).
fn to_ms(us: i64) -> Option<f64> {
    (us >= 0).then(|| (us as f64 / 100.0).round() / 10.0)
}

/// `—` for a missing figure, the figure otherwise.
pub fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "—".to_owned(), |v| v.to_string())
}

/// A budget one hop handed to a downstream call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grant {
    /// The downstream service.
    pub to: String,
    /// The budget granted; `None` without a deadline.
    pub ms: Option<f64>,
    /// When, after the hop's entry.
    pub at_ms: Option<f64>,
    /// The status of the downstream call.
    pub outcome: String,
}

/// How a hop's own work ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Work {
    /// `completed`, or the cause that stopped it.
    pub outcome: String,
    /// When, after the hop's entry.
    pub at_ms: Option<f64>,
}

/// What one service recorded: its budget on entry, what it handed on, how
/// its own work ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    /// The service.
    pub service: String,
    /// The remaining budget on entry; `None` without a deadline.
    pub entry_ms: Option<f64>,
    /// The `grpc-timeout` header as received (empty when absent).
    pub header: String,
    /// The budgets it handed to its downstream calls.
    pub gave: Vec<Grant>,
    /// Its own work, if it did any.
    pub work: Option<Work>,
}

impl Hop {
    /// What this hop handed to `to`, if it called it.
    pub fn gave_to(&self, to: &str) -> Option<&Grant> {
        self.gave.iter().find(|g| g.to == to)
    }
}

/// The hop of `service` in `hops`.
pub fn find<'a>(hops: &'a [Hop], service: &str) -> Option<&'a Hop> {
    hops.iter().find(|h| h.service == service)
}

/// Groups journal records per service: entry budget, header, grants, work.
pub fn hops(records: &[Trace], order: &[&str]) -> Vec<Hop> {
    order
        .iter()
        .filter_map(|service| {
            let mine: Vec<&Trace> = records.iter().filter(|t| t.service == *service).collect();
            let entry = mine.iter().find(|t| t.target.is_empty())?;
            let gave = mine
                .iter()
                .filter(|t| !t.target.is_empty() && t.target != "(work)")
                .map(|t| Grant {
                    to: t.target.clone(),
                    ms: to_ms(t.remaining_us),
                    at_ms: to_ms(t.at_us),
                    outcome: t.outcome.clone(),
                })
                .collect();
            let work = mine.iter().find(|t| t.target == "(work)").map(|t| Work {
                outcome: t.outcome.clone(),
                at_ms: to_ms(t.at_us),
            });
            Some(Hop {
                service: (*service).to_owned(),
                entry_ms: to_ms(entry.remaining_us),
                header: entry.header.clone(),
                gave,
                work,
            })
        })
        .collect()
}
