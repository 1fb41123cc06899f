//! Time as the store's `*_ms` fields hold it.

/// A duration in whole milliseconds, for `*_ms` fields.
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch, for `*_at_ms` fields.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Today's date (UTC) as `YYYY-MM-DD`, for rendered system prompts.
pub(crate) fn today() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        .to_string()
        .chars()
        .take("YYYY-MM-DD".len())
        .collect()
}
