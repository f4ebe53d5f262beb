//! Background processes: started by `POST /v1/processes` (and the `startup` command at boot), kept in a
//! table with capped output, observed, signalled and removed by id. `table` owns the state, `routes` the
//! HTTP surface, `signals` the signal-name parsing.

pub mod routes;
pub mod signals;
pub mod table;
