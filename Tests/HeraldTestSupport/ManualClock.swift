import HeraldCore
import HeraldPorts
import Synchronization

/// A clock the test moves.
public final class ManualClock: Clock {
    private let ms = Atomic<Int64>(1_795_000_000_000)
    /// How far the wall clock was set away from real time (`stepWall`).
    private let wallStep = Atomic<Int64>(0)
    public init() {}
    public func now() -> Millis { ms.load(ordering: .relaxed) + wallStep.load(ordering: .relaxed) }
    public func ticks() -> Millis { ms.load(ordering: .relaxed) }
    /// The system clock set forward or back (NTP, a VM resumed): no time passes.
    public func stepWall(seconds: Int64) { wallStep.add(seconds * 1000, ordering: .relaxed) }
    public func advance(seconds: Int64) { advance(millis: seconds * 1000) }
    public func advance(millis: Int64) { ms.add(millis, ordering: .relaxed) }
}
