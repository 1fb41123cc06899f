//! `forkctl calc`: the fork cost calculator, priced by the daemon's own price table.

use clap::Args;
use forkd_proto::v1::EstimateForkCostRequest;

use crate::client::Client;
use crate::exit;
use crate::output::{Printer, estimate_json, human};

#[derive(Debug, Args)]
pub struct CalcArgs {
    /// Tokens of the shared prefix (system, tools, the parent's history).
    #[arg(long, value_name = "N")]
    pub prefix: u64,

    /// Tokens of one child's directive.
    #[arg(long, value_name = "N")]
    pub directive: u64,

    /// How many children the batch has.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub children: u32,

    /// The model whose prices apply; the daemon's default when omitted.
    #[arg(long)]
    pub model: Option<String>,

    /// Price a 1-hour cache entry (writes cost 2× instead of 1.25×).
    #[arg(long)]
    pub one_hour: bool,
}

pub async fn run(args: CalcArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let request = EstimateForkCostRequest {
        prefix_tokens: args.prefix,
        directive_tokens: args.directive,
        children: args.children,
        model: args.model.unwrap_or_default(),
        one_hour_cache: args.one_hour,
    };
    let estimate = client.estimate_fork_cost(request).await?.into_inner();
    if out.is_json() {
        out.value(&estimate_json(&estimate))?;
    } else {
        out.line(human::estimate_table(&estimate, args.one_hour))?;
    }
    Ok(exit::OK)
}
