//! One attempt: the body signed to the Standard Webhooks specification and posted to the
//! webhook's URL through [`forkd_egress::Egress`], and what the answer means.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use forkd_core::DeliveryId;
use forkd_core::webhook::Attempt;
use forkd_egress::Egress;
use standardwebhooks::{
    HEADER_WEBHOOK_ID, HEADER_WEBHOOK_SIGNATURE, HEADER_WEBHOOK_TIMESTAMP, Webhook as Signer,
};

/// How much of a receiver's answer is read (the rest is dropped): enough for an error's words.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// How much of a failed answer's body an attempt's error quotes.
const QUOTED_CHARS: usize = 200;

/// What one attempt sends.
pub(crate) struct Request<'a> {
    pub url: &'a str,
    pub delivery: DeliveryId,
    /// The envelope, as JSON text: the bytes signed are the bytes sent.
    pub body: &'a str,
    /// The signing secrets, `whsec_…`: the current one first, then one rotated out that still
    /// signs. Each gives one signature.
    pub secrets: &'a [String],
}

/// What came of an attempt: its record (number and delivery filled by the caller's store) and,
/// for a 429 or 503, how long the receiver asked to be left alone.
pub(crate) struct Outcome {
    pub attempt: Attempt,
    pub retry_after: Option<Duration>,
}

/// The `webhook-signature` header: one `v1,…` per secret, space-separated.
pub(crate) fn signature(
    secrets: &[String],
    id: &str,
    timestamp: i64,
    body: &str,
) -> Result<String, String> {
    let mut signatures = Vec::with_capacity(secrets.len());
    for secret in secrets {
        let signer = Signer::new(secret).map_err(|e| format!("the signing secret: {e}"))?;
        signatures.push(
            signer
                .sign(id, timestamp, body.as_bytes())
                .map_err(|e| format!("signing: {e}"))?,
        );
    }
    Ok(signatures.join(" "))
}

/// Sends one attempt and reads at most [`MAX_ANSWER_BYTES`] of the answer.
pub(crate) async fn attempt(egress: &Egress, req: Request<'_>) -> Outcome {
    let at_ms = crate::clock::now_ms();
    let started = Instant::now();
    let outcome = send(egress, &req).await;
    let latency_ms = crate::clock::millis(started.elapsed());
    let (status, error, retry_after) = match outcome {
        Ok(answer) => answer,
        Err(error) => (None, Some(error), None),
    };
    Outcome {
        attempt: Attempt {
            delivery_id: req.delivery,
            number: 0,
            at_ms,
            status,
            error,
            latency_ms,
        },
        retry_after,
    }
}

type Answer = (Option<u16>, Option<String>, Option<Duration>);

async fn send(egress: &Egress, req: &Request<'_>) -> Result<Answer, String> {
    let url = forkd_egress::parse_url(req.url).map_err(|e| e.to_string())?;
    egress.check_literal(&url).map_err(|e| e.to_string())?;
    let id = req.delivery.to_string();
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let signature = signature(req.secrets, &id, timestamp, req.body)?;
    let response = egress
        .client()
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(
            reqwest::header::USER_AGENT,
            concat!("forkd/", env!("CARGO_PKG_VERSION")),
        )
        .header(HEADER_WEBHOOK_ID, &id)
        .header(HEADER_WEBHOOK_TIMESTAMP, timestamp.to_string())
        .header(HEADER_WEBHOOK_SIGNATURE, signature)
        .body(req.body.to_owned())
        .send()
        .await
        .map_err(|e| describe(&e))?;
    let status = response.status();
    let retry_after = (status == reqwest::StatusCode::TOO_MANY_REQUESTS
        || status == reqwest::StatusCode::SERVICE_UNAVAILABLE)
        .then(|| retry_after(response.headers()))
        .flatten();
    let location = response
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .map(str::to_owned);
    let answer = read_capped(response).await;
    if status.is_success() {
        return Ok((Some(status.as_u16()), None, None));
    }
    let error = if status.is_redirection() {
        format!(
            "HTTP {status}: a redirect (to {}), not followed",
            location.as_deref().unwrap_or("nowhere")
        )
    } else {
        let quoted: String = answer.chars().take(QUOTED_CHARS).collect();
        format!("HTTP {status}: {}", quoted.trim())
    };
    Ok((Some(status.as_u16()), Some(error), retry_after))
}

/// Up to [`MAX_ANSWER_BYTES`] of the body, as text; the rest is never read.
async fn read_capped(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < MAX_ANSWER_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(MAX_ANSWER_BYTES);
    String::from_utf8_lossy(&body).into_owned()
}

/// `retry-after` in seconds or as an HTTP date.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or_default())
}

/// A failed request in words: the address refusal when that was it, else reqwest's chain.
fn describe(err: &reqwest::Error) -> String {
    if let Some(refusal) = forkd_egress::refusal(err) {
        return format!("refused: {refusal}");
    }
    let mut text = if err.is_timeout() {
        "no answer in time".to_owned()
    } else if err.is_connect() {
        "could not connect".to_owned()
    } else {
        "the request failed".to_owned()
    };
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn every_secret_signs_and_the_specification_s_verifier_accepts_each() {
        let current = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned();
        let previous = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD".to_owned();
        let header = signature(
            &[current.clone(), previous.clone()],
            "msg_1",
            1_700_000_000,
            "{}",
        )
        .expect("signed");
        assert_eq!(header.split(' ').count(), 2);
        for secret in [&current, &previous] {
            let expected = Signer::new(secret)
                .expect("a secret")
                .sign("msg_1", 1_700_000_000, b"{}")
                .expect("signed");
            assert!(header.split(' ').any(|s| s == expected), "{header}");
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::RETRY_AFTER, "7".parse().expect("a value"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        headers.insert(
            reqwest::header::RETRY_AFTER,
            later.parse().expect("a value"),
        );
        let wait = retry_after(&headers).expect("a date");
        assert!(wait > Duration::from_secs(100) && wait <= Duration::from_secs(120));
    }
}
