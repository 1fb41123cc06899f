//! W3C trace context (`traceparent`) for forkd's spans (docs/operations.md, "Tracing"): a
//! caller's context adopted by the span of its call, and a batch's or agent's context kept in the
//! store, so that work resumed after a restart, or adopted by another daemon, goes on in the same
//! trace. Without an OpenTelemetry layer in the subscriber these do nothing.

use opentelemetry::Context;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// A count as a span attribute: OpenTelemetry attributes are signed, and the layer would record an
/// unsigned value as text.
pub fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The `traceparent` of `span` (`00-<trace id>-<span id>-<flags>`), or `None` when it is not
/// traced.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let sc = context.span().span_context().clone();
    sc.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}

/// The span context a `traceparent` names; `None` for anything malformed (version `ff`, wrong
/// lengths, all-zero ids).
pub fn parse(traceparent: &str) -> Option<SpanContext> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2
        || version == "ff"
        || trace.len() != 32
        || span.len() != 16
        || flags.len() != 2
    {
        return None;
    }
    // Version 00 has exactly four fields; later versions may add some.
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let sc = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    sc.is_valid().then_some(sc)
}

/// Makes `span` a child of the span `traceparent` names, before it is first entered. Returns
/// whether it did (a malformed value, or a span already started or not traced, is left alone).
pub fn adopt(span: &tracing::Span, traceparent: &str) -> bool {
    let Some(sc) = parse(traceparent) else {
        return false;
    };
    span.set_parent(Context::new().with_remote_span_context(sc))
        .is_ok()
}

/// Links `span` to the span `traceparent` names (a sibling's request that wrote what this one
/// reads). A malformed value adds nothing.
pub fn link(span: &tracing::Span, traceparent: &str) {
    if let Some(sc) = parse(traceparent) {
        span.add_link(sc);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]

    use super::*;

    #[test]
    fn traceparents_parse_as_the_w3c_spec_says() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse(good).expect("valid");
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
        assert!(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra").is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-xyz92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn without_a_layer_nothing_is_traced() {
        let span = tracing::info_span!("x");
        assert_eq!(traceparent(&span), None);
        assert!(!adopt(
            &span,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
    }
}
