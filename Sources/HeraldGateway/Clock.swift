import HeraldCore

/// The gateway's time source: injected, so tests drive token timers, poll
/// deadlines and expiry without waiting.
public protocol Clock: Sendable {
    func now() -> Millis
}

public struct SystemClock: Clock {
    public init() {}
    public func now() -> Millis { WallClock.now() }
}
