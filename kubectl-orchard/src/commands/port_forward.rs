//! `port-forward SANDBOX [LOCAL:]REMOTE`: listens on a local port and carries each accepted
//! connection through a tunnel of its own to REMOTE on the sandbox's loopback, until Ctrl-C.

use std::io::Write;

use tokio::net::{TcpListener, TcpStream};

use crate::cli::PortForwardArgs;
use crate::error::{CliError, Result};
use crate::gateway::Gateway;
use crate::tunnel;

/// Forwards until Ctrl-C; 0 then.
pub async fn run(gateway: &Gateway, args: PortForwardArgs) -> Result<u8> {
    let (local, remote) = tunnel::parse_ports(&args.ports)?;
    let listener = TcpListener::bind((args.address, local))
        .await
        .map_err(|e| CliError::local(format!("listening on {}:{local}", args.address), e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| CliError::local("listening socket", e))?;
    println!("Forwarding from {bound} -> {remote}");
    flush_stdout();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((connection, _)) => {
                    println!("Handling connection for {}", bound.port());
                    flush_stdout();
                    let (gateway, sandbox) = (gateway.clone(), args.sandbox.clone());
                    tokio::spawn(async move { forward(&gateway, &sandbox, remote, connection).await });
                }
                Err(e) => eprintln!("{}", CliError::local("accepting a connection", e).line()),
            },
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
    }
}

/// Carries one connection through a tunnel; a refusal is printed and the connection closed.
async fn forward(gateway: &Gateway, sandbox: &str, remote: u16, mut connection: TcpStream) {
    let _ = connection.set_nodelay(true);
    match tunnel::open(gateway, sandbox, remote).await {
        Ok(mut tunnel) => {
            // Either side closing (or breaking) ends the connection: nothing more to report.
            let _ = tokio::io::copy_bidirectional(&mut connection, &mut tunnel).await;
        }
        Err(error) => eprintln!("{}", error.line()),
    }
}

fn flush_stdout() {
    let _ = std::io::stdout().flush();
}
