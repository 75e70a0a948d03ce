//! Client-observed histories: what was asked, when, and what came back.

use chorus_core::{Command, Outcome, Time};

/// One client operation as the client saw it.
#[derive(Clone, Debug)]
pub struct Operation {
    /// Position in the history; stable, used in reports.
    pub id: usize,
    /// The client (a sequential process) that issued it.
    pub client: u32,
    pub command: Command,
    /// When the client sent it.
    pub invoke: Time,
    /// When and how it completed. `None`: the outcome is unknown (the client gave up, or the
    /// replica crashed): the operation may or may not have taken effect, at any point after
    /// `invoke`.
    pub completion: Option<Completion>,
}

#[derive(Clone, Debug)]
pub struct Completion {
    pub at: Time,
    pub outcome: Outcome,
}

/// A whole run's operations, in invocation order.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub operations: Vec<Operation>,
}
