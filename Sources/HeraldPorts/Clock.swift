import Dispatch
import HeraldCore

/// The gateway's time sources: injected, so tests drive token timers, poll
/// deadlines and expiry without waiting.
public protocol Clock: Sendable {
    /// Wall time (RFC 3339 times, expiry, token `exp`): may step when the
    /// system clock is set (NTP, a VM resumed).
    func now() -> Millis
    /// Milliseconds that only move forward, at the pace of real time: for
    /// intervals and deadlines (timers, keep-alives, pings, rate limits,
    /// maintenance), which a step of the wall clock must not fire early or
    /// hold back.
    func ticks() -> Millis
}

public struct SystemClock: Clock {
    public init() {}
    public func now() -> Millis { WallClock.now() }
    public func ticks() -> Millis { Millis(DispatchTime.now().uptimeNanoseconds / 1_000_000) }
}
