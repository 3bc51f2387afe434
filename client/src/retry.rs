//! The one retry policy of every caller of the API: which failures are
//! tried again, how long to wait between attempts, and when to give up.
//!
//! A [`RetryPolicy`] is pure data and pure arithmetic; the client
//! ([`crate::Client`]) applies it around each request, and callers that
//! drive their own loop (the executor's report delivery, which batches
//! while it waits) ask it directly with [`RetryPolicy::next_delay`].
//!
//! * What is retried ([`Retry::Transient`], the default): a request that
//!   got no answer ([`ClientError::Unreachable`], [`ClientError::Timeout`])
//!   and the answers that say "later" — 5xx, 408 and 429. Everything else
//!   (a 4xx, a body that does not decode) is final: trying again would get
//!   the same answer. [`Retry::Any`] retries those too, for callers whose
//!   next attempt may differ (credentials that change when an executor
//!   registers again) or that must never give up.
//! * Backoff: `first_delay` before the second attempt, doubling up to
//!   `max_delay` (a constant delay when both are equal). No jitter: the
//!   callers are a handful of executors and people, not a thundering herd.
//! * Giving up: after `max_attempts` attempts (the first included), or when
//!   the next attempt would start more than `max_elapsed` after the first;
//!   `None` is no limit. The default is one attempt: a client retries only
//!   when its caller chose a policy.

use crate::ClientError;
use std::time::Duration;

/// Which failures a [`RetryPolicy`] tries again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retry {
    /// No answer, 5xx, 408 and 429 ([`ClientError::is_transient`]).
    #[default]
    Transient,
    /// Every failure, refusals and undecodable answers included.
    Any,
}

/// How often, how patiently and on what a request is tried again (see the
/// module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Which failures are retried.
    pub retry: Retry,
    /// Most attempts, the first included (`None`: unlimited).
    pub max_attempts: Option<u32>,
    /// No attempt starts later than this after the first (`None`: no limit).
    pub max_elapsed: Option<Duration>,
    /// Wait before the second attempt.
    pub first_delay: Duration,
    /// Longest wait between two attempts (the delay doubles up to it).
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy::once()
    }
}

impl RetryPolicy {
    /// One attempt, no retry.
    pub const fn once() -> RetryPolicy {
        RetryPolicy {
            retry: Retry::Transient,
            max_attempts: Some(1),
            max_elapsed: None,
            first_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
        }
    }

    /// Transient failures retried without end, waiting `first_delay`,
    /// doubling up to `max_delay`.
    pub const fn forever(first_delay: Duration, max_delay: Duration) -> RetryPolicy {
        RetryPolicy {
            retry: Retry::Transient,
            max_attempts: None,
            max_elapsed: None,
            first_delay,
            max_delay,
        }
    }

    /// Transient failures retried every `every` for up to `within` after
    /// the first attempt.
    pub const fn patient(within: Duration, every: Duration) -> RetryPolicy {
        RetryPolicy {
            retry: Retry::Transient,
            max_attempts: None,
            max_elapsed: Some(within),
            first_delay: every,
            max_delay: every,
        }
    }

    /// This policy retrying `retry` failures.
    pub const fn retrying(self, retry: Retry) -> RetryPolicy {
        RetryPolicy { retry, ..self }
    }

    /// This policy with at most `n` attempts.
    pub const fn max_attempts(self, n: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts: Some(n),
            ..self
        }
    }

    /// The wait after the `attempt`-th failed attempt (1 = the first):
    /// `first_delay · 2^(attempt-1)`, at most `max_delay`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.first_delay
            .saturating_mul(1u32 << doublings)
            .min(self.max_delay)
    }

    /// Whether this policy retries `error` at all.
    pub fn retries(&self, error: &ClientError) -> bool {
        match self.retry {
            Retry::Transient => error.is_transient(),
            Retry::Any => true,
        }
    }

    /// After `attempts` attempts made over `elapsed` since the first, the
    /// last failing with `error`: how long to wait before the next one, or
    /// `None` to give up.
    pub fn next_delay(
        &self,
        error: &ClientError,
        attempts: u32,
        elapsed: Duration,
    ) -> Option<Duration> {
        if !self.retries(error) || self.max_attempts.is_some_and(|max| attempts >= max) {
            return None;
        }
        let wait = self.delay(attempts);
        match self.max_elapsed {
            Some(limit) if elapsed.saturating_add(wait) > limit => None,
            _ => Some(wait),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Problem;

    fn unreachable() -> ClientError {
        ClientError::Unreachable {
            url: "http://127.0.0.1:9/v1/jobs".into(),
            cause: "Connection refused (os error 111)".into(),
        }
    }

    fn status(code: u16) -> ClientError {
        ClientError::Status(Box::new(Problem::from_body(code, "")))
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_default_is_one_attempt() {
        let p = RetryPolicy::default();
        assert_eq!(p.next_delay(&unreachable(), 1, Duration::ZERO), None);
    }

    #[test]
    fn only_transient_failures_are_retried_by_default() {
        let p = RetryPolicy::forever(200 * MS, 5000 * MS);
        for transient in [
            unreachable(),
            status(500),
            status(503),
            status(408),
            status(429),
        ] {
            assert!(p.retries(&transient), "{transient}");
        }
        let timeout = ClientError::Timeout {
            url: "u".into(),
            after: Duration::from_secs(5),
        };
        assert!(p.retries(&timeout));
        let decode = ClientError::Decode {
            url: "u".into(),
            status: 200,
            reason: "is not JSON".into(),
        };
        for last in [
            status(400),
            status(401),
            status(404),
            status(409),
            status(410),
            decode,
        ] {
            assert!(!p.retries(&last), "{last}");
            assert_eq!(p.next_delay(&last, 1, Duration::ZERO), None);
            assert!(p.retrying(Retry::Any).retries(&last), "{last}");
        }
    }

    #[test]
    fn the_delay_doubles_up_to_its_ceiling() {
        let p = RetryPolicy::forever(200 * MS, 3200 * MS);
        let waits: Vec<u128> = (1..=7).map(|n| p.delay(n).as_millis()).collect();
        assert_eq!(waits, [200, 400, 800, 1600, 3200, 3200, 3200]);
        assert_eq!(p.delay(u32::MAX), 3200 * MS, "no overflow");
        let constant = RetryPolicy::patient(Duration::from_secs(60), 1000 * MS);
        assert!((1..50).all(|n| constant.delay(n) == 1000 * MS));
    }

    #[test]
    fn attempts_and_elapsed_time_are_bounded() {
        let p = RetryPolicy::forever(100 * MS, 100 * MS).max_attempts(3);
        assert_eq!(
            p.next_delay(&unreachable(), 1, Duration::ZERO),
            Some(100 * MS)
        );
        assert_eq!(
            p.next_delay(&unreachable(), 2, Duration::ZERO),
            Some(100 * MS)
        );
        assert_eq!(p.next_delay(&unreachable(), 3, Duration::ZERO), None);

        let p = RetryPolicy::patient(Duration::from_secs(60), 1000 * MS);
        assert_eq!(
            p.next_delay(&unreachable(), 40, Duration::from_secs(59)),
            Some(1000 * MS),
            "the attempt starts at 60 s, within the patience"
        );
        assert_eq!(
            p.next_delay(&unreachable(), 41, Duration::from_millis(59_500)),
            None
        );
        let forever = RetryPolicy::forever(100 * MS, 100 * MS);
        assert!(forever
            .next_delay(&unreachable(), 1_000_000, Duration::from_secs(86_400))
            .is_some());
    }
}
