//! One module per command.

pub mod channels;
pub mod chat;
pub mod config_cmd;
pub mod health;
pub mod init;
pub mod run;
pub mod serve;
pub mod threads;
