//! Shell sessions: a persistent shell per session (`POST /v1/sessions`) that runs commands one at a
//! time, keeping its working directory, variables and functions between them. `shell` picks the shell
//! and holds the prelude it is given; `marker` finds the end of each run in the output stream; `output`
//! keeps that output (capped and charged like exec output); `process` runs one shell; `process_tree`
//! finds what an interrupted command left running; `session` runs, interrupts, reads and writes;
//! `table` holds the sessions; `routes` is the HTTP surface.

pub mod marker;
pub mod output;
pub mod process;
pub mod process_tree;
pub mod routes;
pub mod session;
pub mod shell;
pub mod table;
