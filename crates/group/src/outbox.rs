//! What a group core wants done after one call: messages to send and operations to complete.

use chorus_core::NodeId;

use crate::message::GroupMessage;
use crate::op::{GroupError, OpOutcome};

/// Identifies one operation submitted to a [`crate::GroupCaller`], chosen by the runtime and
/// handed back with its completion.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct RequestId(pub u64);

#[derive(Debug, Default)]
pub struct GroupOutbox {
    pub messages: Vec<(NodeId, GroupMessage)>,
    pub completions: Vec<(RequestId, Result<OpOutcome, GroupError>)>,
}

impl GroupOutbox {
    pub fn send(&mut self, to: NodeId, message: GroupMessage) {
        self.messages.push((to, message));
    }
    pub fn complete(&mut self, request: RequestId, result: Result<OpOutcome, GroupError>) {
        self.completions.push((request, result));
    }
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty() && self.completions.is_empty()
    }
    pub fn clear(&mut self) {
        self.messages.clear();
        self.completions.clear();
    }
}
