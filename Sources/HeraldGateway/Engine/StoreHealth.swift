import HeraldCore
import HeraldPorts
import Synchronization

/// Whether the store answered its last use, for `/healthz`, and the one
/// place store failures are logged: the first failure at once, then at most
/// one line per `logInterval` with how many more there were (a store that is
/// down fails every batch, read and 250 ms maintenance tick), and a line when
/// it works again. Used from the engine and reader threads.
public final class StoreHealth: Sendable {
    static let logInterval: Millis = 10_000
    /// Answered for everything the store could not do: nothing changed, try
    /// again shortly.
    static let unavailable = HeraldError(.unavailable, "storage is unavailable; nothing was changed", retryAfterSeconds: 2)
    /// Answered when the store went away while committing: the change may
    /// have been made. A publish is safe to repeat (same appNotificationId).
    static let outcomeUnknown = HeraldError(.unavailable, "storage became unavailable while saving; the change may have been made",
                                            retryAfterSeconds: 2)

    private struct State {
        var failing = false
        var lastLog: Millis = 0
        var unlogged = 0
    }

    private let state = Mutex(State())
    private let clock: Clock

    init(clock: Clock) { self.clock = clock }

    public var isAvailable: Bool { state.withLock { !$0.failing } }

    func failed(_ what: String, _ error: any Error) {
        let now = clock.ticks()
        let line: String? = state.withLock { s in
            s.failing = true
            guard now - s.lastLog >= Self.logInterval else {
                s.unlogged += 1
                return nil
            }
            defer { s.lastLog = now; s.unlogged = 0 }
            return "store: \(what) failed: \(error)" + (s.unlogged > 0 ? " (and \(s.unlogged) more failures since the last line)" : "")
        }
        if let line { Log.error(line) }
    }

    func succeeded() {
        let recovered = state.withLock { s -> Bool in
            guard s.failing else { return false }
            s.failing = false
            s.lastLog = 0
            s.unlogged = 0
            return true
        }
        if recovered { Log.info("store: available again") }
    }
}
