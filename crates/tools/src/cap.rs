//! Output capping that keeps both ends: the start of a command's output says what it did, the
//! end says how it finished (the error, the test summary), and the middle is what can go.

use std::collections::VecDeque;

/// A streaming buffer that keeps at most `cap` bytes: the first half and the last half of
/// everything pushed, counting what fell out in between. Memory stays bounded however much a
/// command prints.
#[derive(Debug)]
pub(crate) struct HeadTail {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    omitted: u64,
}

impl HeadTail {
    pub(crate) fn new(cap: usize) -> HeadTail {
        let head_cap = cap / 2;
        HeadTail {
            head_cap,
            tail_cap: cap - head_cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            omitted: 0,
        }
    }

    pub(crate) fn push(&mut self, mut bytes: &[u8]) {
        let room = self.head_cap - self.head.len();
        let (to_head, rest) = bytes.split_at(room.min(bytes.len()));
        self.head.extend_from_slice(to_head);
        bytes = rest;
        if bytes.len() >= self.tail_cap {
            let skip = bytes.len() - self.tail_cap;
            self.omitted += (self.tail.len() + skip) as u64;
            self.tail.clear();
            self.tail.extend(&bytes[skip..]);
            return;
        }
        self.tail.extend(bytes);
        let excess = self.tail.len().saturating_sub(self.tail_cap);
        self.tail.drain(..excess);
        self.omitted += excess as u64;
    }

    /// How many bytes were dropped from the middle.
    pub(crate) fn omitted(&self) -> u64 {
        self.omitted
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head.is_empty()
    }

    /// The kept text, with a marker where bytes were dropped. A UTF-8 sequence cut by the drop
    /// is trimmed from both sides rather than shown as a replacement character.
    pub(crate) fn finish(self) -> String {
        let mut head = self.head;
        let mut tail: Vec<u8> = self.tail.into();
        if self.omitted == 0 {
            head.extend_from_slice(&tail);
            return String::from_utf8_lossy(&head).into_owned();
        }
        let mut omitted = self.omitted;
        if let Err(e) = std::str::from_utf8(&head)
            && e.error_len().is_none()
        {
            omitted += (head.len() - e.valid_up_to()) as u64;
            head.truncate(e.valid_up_to());
        }
        let continuation = tail.iter().take_while(|b| (**b & 0xC0) == 0x80).count();
        tail.drain(..continuation);
        omitted += continuation as u64;
        format!(
            "{}\n… {omitted} bytes omitted …\n{}",
            String::from_utf8_lossy(&head),
            String::from_utf8_lossy(&tail)
        )
    }
}

/// `text` capped to about `cap` bytes, keeping its head and tail.
pub(crate) fn cap_text(text: &str, cap: usize) -> String {
    let mut buf = HeadTail::new(cap);
    buf.push(text.as_bytes());
    buf.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_passes_through() {
        assert_eq!(cap_text("hello", 100), "hello");
        let mut buf = HeadTail::new(10);
        buf.push(b"abcd");
        buf.push(b"efghij");
        assert_eq!(buf.finish(), "abcdefghij");
    }

    #[test]
    fn long_output_keeps_head_and_tail_in_any_chunking() {
        let text: String = (0..1000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let expected = format!("{}\n… 980 bytes omitted …\n{}", &text[..10], &text[990..]);
        assert_eq!(cap_text(&text, 20), expected);
        for chunk in [1, 3, 7, 64] {
            let mut buf = HeadTail::new(20);
            for piece in text.as_bytes().chunks(chunk) {
                buf.push(piece);
            }
            assert_eq!(buf.finish(), expected, "chunk {chunk}");
        }
    }

    #[test]
    fn multibyte_characters_are_not_split() {
        let text = "é".repeat(100);
        let capped = cap_text(&text, 11);
        assert!(!capped.contains('\u{FFFD}'), "{capped}");
        // 5 head bytes hold two characters and half of a third, which is dropped.
        assert!(capped.starts_with("éé\n… "), "{capped}");
        assert!(capped.ends_with("\nééé"), "{capped}");
        assert!(capped.contains("… 190 bytes omitted …"), "{capped}");
    }
}
