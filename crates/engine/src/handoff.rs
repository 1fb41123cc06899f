//! A parent turn's handoff to the background, decided once.

/// Whether a turn was handed to the background before it ended: then no client sees its end,
/// and the turn ends with a notification of kind `turn` instead. Deciding both under one lock
/// means exactly one of the two happens: the client hears the turn's end, or it heard
/// `AsyncLaunched` and the notification stream hears the end.
#[derive(Debug, Default)]
pub(crate) struct Handoff(std::sync::Mutex<HandoffState>);

#[derive(Debug, Default)]
struct HandoffState {
    backgrounded: bool,
    ended: bool,
}

impl Handoff {
    /// A turn no client watches (one resumed after a restart) is in the background from the
    /// start.
    pub(crate) fn in_background() -> Self {
        Handoff(std::sync::Mutex::new(HandoffState {
            backgrounded: true,
            ended: false,
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HandoffState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands the turn to the background, unless it has ended already (false: its end is on its
    /// way to the client).
    pub(crate) fn background(&self) -> bool {
        let mut state = self.state();
        if !state.ended {
            state.backgrounded = true;
        }
        !state.ended
    }

    /// Whether the turn's handoff already happened.
    pub(crate) fn is_backgrounded(&self) -> bool {
        self.state().backgrounded
    }

    /// Ends the turn; true when it was in the background (its end is a notification).
    pub(crate) fn end(&self) -> bool {
        let mut state = self.state();
        state.ended = true;
        state.backgrounded
    }
}
