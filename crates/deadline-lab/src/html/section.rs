//! The report's sections, and the parts an experiment draws in them.

use super::chart::{self, Group};

/// The report's sections, in the order the page shows them. Each
/// experiment names the one it belongs to
/// ([`Experiment::SECTION`](crate::registry::Experiment::SECTION)); a
/// section is shown when one of its experiments drew in it, failed or was
/// skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The budget each hop had on entry.
    BudgetPerHop,
    /// An HTTP edge, gRPC and SQL under one budget.
    BeyondTonic,
    /// What relative timeouts lose in transit.
    Transit,
    /// Work done after the client gave up: one chart, to which each
    /// experiment adds its [bars](Part::bars).
    WorkAfterGivingUp,
    /// Goodput under overload.
    Overload,
    /// Overload that outlives its trigger.
    Metastable,
    /// Across hosts, proxies and faults.
    Across,
    /// HTTP/2 Rapid Reset floods.
    ResetFloods,
    /// Retries on every hop of a chain.
    RetriesAcrossHops,
    /// Retries and hedging inside one deadline.
    RetriesAndHedging,
    /// One request traced hop by hop.
    Waterfall,
    /// The ledger a DEADLINE_EXCEEDED brings back.
    Ledger,
    /// Frames on the wire.
    OnTheWire,
    /// What a long run left behind.
    LeftBehind,
}

impl Section {
    /// Every section, in the page's order.
    pub const ALL: [Section; 14] = [
        Section::BudgetPerHop,
        Section::BeyondTonic,
        Section::Transit,
        Section::WorkAfterGivingUp,
        Section::Overload,
        Section::Metastable,
        Section::Across,
        Section::ResetFloods,
        Section::RetriesAcrossHops,
        Section::RetriesAndHedging,
        Section::Waterfall,
        Section::Ledger,
        Section::OnTheWire,
        Section::LeftBehind,
    ];

    /// Its heading.
    pub fn heading(self) -> &'static str {
        match self {
            Section::BudgetPerHop => "Budget per hop",
            Section::BeyondTonic => "Beyond tonic: HTTP edge → gRPC → SQL, and → reqwest",
            Section::Transit => "Transit time is not deducted",
            Section::WorkAfterGivingUp => "0 vs 1: work after the client gave up",
            Section::Overload => "Goodput under overload",
            Section::Metastable => "Overload that outlives its trigger",
            Section::Across => "Across hosts, proxies and faults",
            Section::ResetFloods => "Reset floods (HTTP/2 Rapid Reset)",
            Section::RetriesAcrossHops => "Retries across hops",
            Section::RetriesAndHedging => "Retries and hedging inside one deadline",
            Section::Waterfall => "Where the budget went",
            Section::Ledger => "Where the budget went: the ledger",
            Section::OnTheWire => "On the wire",
            Section::LeftBehind => "Nothing left behind",
        }
    }

    /// What it opens with, before any experiment's part.
    pub(crate) fn intro(self) -> &'static str {
        match self {
            Section::OnTheWire => {
                "<p class=\"muted\">Frames decoded by the capture proxy (HPACK-decoded headers; RST_STREAM with its error code).</p>"
            }
            _ => "",
        }
    }

    /// The chart the section draws from its experiments' [bars](Part::bars),
    /// if it has one.
    pub(crate) fn chart(self, groups: &[Group]) -> Option<String> {
        match self {
            Section::WorkAfterGivingUp => Some(chart::grouped(
                "completions",
                "Work completed after the client gave up (0 is right; 1 is wasted work)",
                "completions",
                &["completions"],
                groups,
            )),
            _ => None,
        }
    }
}

/// What an experiment draws in the report: HTML in a section, or bars of a
/// chart its section shares with other experiments.
#[derive(Debug, Clone)]
pub struct Part {
    /// `None`: the experiment's own section.
    pub(crate) section: Option<Section>,
    pub(crate) drawn: Drawn,
}

#[derive(Debug, Clone)]
pub(crate) enum Drawn {
    Html(String),
    Bars(Vec<Group>),
}

impl Part {
    /// `html` in the experiment's own section.
    pub fn new(html: String) -> Self {
        Self {
            section: None,
            drawn: Drawn::Html(html),
        }
    }

    /// `html` in `section`, not the experiment's own.
    pub fn in_section(section: Section, html: String) -> Self {
        Self {
            section: Some(section),
            drawn: Drawn::Html(html),
        }
    }

    /// Bars of the chart the experiment's section draws from every
    /// experiment in it ([`Section::WorkAfterGivingUp`]).
    pub fn bars(groups: Vec<Group>) -> Self {
        Self {
            section: None,
            drawn: Drawn::Bars(groups),
        }
    }
}
