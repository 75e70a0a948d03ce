//! placeholder
pub mod checker;
pub mod history;
