//! The commands of `fleetrun`, a file each: its arguments and what it does.

pub mod cancel;
pub mod convert;
pub mod dlq;
pub mod jobs;
pub mod resume;
pub mod retry;
pub mod run;
pub mod serve;
pub mod status;
pub mod submit;
pub mod verify;
pub mod wait;
