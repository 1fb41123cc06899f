//! `forkctl ui`: a one-time link that signs the browser in to the daemon's web view as its own
//! user (tenant `local`).
//!
//! The web view never takes a TCP connection's word for being the local user (any process on
//! the machine can open one); the Unix socket is how the local user proves it. So the link is
//! asked for over the socket, and only there.

use std::time::SystemTime;

use clap::Args;
use forkd_proto::v1::CreateSignInLinkRequest;
use serde_json::json;

use crate::client::{Addr, Client};
use crate::exit::{self, CliError};
use crate::output::Printer;

#[derive(Debug, Args)]
pub struct UiArgs {}

/// Refuses, before connecting, an address that is not a Unix socket: the daemon would refuse
/// the call there anyway, and this says what to do instead.
pub fn check_addr(addr: &Addr) -> Result<(), CliError> {
    match addr {
        Addr::Unix(_) => Ok(()),
        Addr::Http(_) | Addr::Https(_) => Err(CliError::InvalidInput(format!(
            "`forkctl ui` signs in as the daemon's own user, which only its Unix socket proves, \
             and {addr} is TCP: run it on the daemon's machine without --addr / FORKD_ADDR (or \
             with unix:$FORKD_HOME/forkd.sock); with a token, sign in on the web view's page \
             instead"
        ))),
    }
}

pub async fn run(_args: UiArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let reply = client
        .create_sign_in_link(CreateSignInLinkRequest {})
        .await?
        .into_inner();
    if out.is_json() {
        out.value(&json!({
            "url": reply.url,
            "expires_at": reply.expires_at.map(|t| t.to_string()),
        }))?;
    } else {
        out.line(&reply.url)?;
        let seconds = reply
            .expires_at
            .and_then(|t| SystemTime::try_from(t).ok())
            .and_then(|at| at.duration_since(SystemTime::now()).ok())
            .map(|left| left.as_secs_f64().round());
        let within = match seconds {
            Some(s) => format!(" within {s} seconds"),
            None => String::new(),
        };
        eprintln!(
            "forkctl: open it{within} to sign in as tenant `local`; it works once (run `forkctl \
             ui` again for another)"
        );
    }
    Ok(exit::OK)
}
