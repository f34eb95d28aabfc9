//! The two sides every benchmark compares: our layers, and plain tonic.

/// Our layers or plain tonic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Variant {
    /// tonic with our layers.
    Ours,
    /// tonic without them.
    Plain,
}

impl Variant {
    /// Its name on a child's command line: `ours`, `plain`.
    pub fn arg(self) -> &'static str {
        match self {
            Variant::Ours => "ours",
            Variant::Plain => "plain",
        }
    }
}
