//! The page's static files, embedded in the binary (no build step: a plain ES module and a
//! stylesheet), and the headers every response carries.

use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../assets/index.html");
const SCRIPT: &str = include_str!("../assets/app.js");
const UI: &str = include_str!("../assets/ui.js");
const AUTOMATIONS: &str = include_str!("../assets/automations.js");
const STYLE: &str = include_str!("../assets/style.css");

pub(crate) async fn index() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX)
}

pub(crate) async fn script() -> impl IntoResponse {
    javascript(SCRIPT)
}

/// The helpers the page's modules share.
pub(crate) async fn ui() -> impl IntoResponse {
    javascript(UI)
}

/// The webhooks and schedules page.
pub(crate) async fn automations() -> impl IntoResponse {
    javascript(AUTOMATIONS)
}

fn javascript(text: &'static str) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        text,
    )
}

pub(crate) async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE)
}

/// The page runs only its own script and talks only to its own origin; no other site may frame
/// it; nothing is cached (transcripts are private).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

pub(crate) async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
