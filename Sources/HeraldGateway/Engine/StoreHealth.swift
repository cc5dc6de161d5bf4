import HeraldCore
import HeraldPorts
import Synchronization

/// Whether the store answered its last use, for `/healthz`, and the one
/// place store failures are logged: the first failure at once, then at most
/// one line per `logInterval` with how many more there were (a store that is
/// down fails every batch, read and 250 ms maintenance tick), and a line when
/// it works again. A failed write is cleared only by a write that worked: a
/// full disk still answers reads, and maintenance reads every 250 ms, so a
/// read would otherwise call healthy a store that refuses every change.
/// Used from the engine and reader threads.
public final class StoreHealth: Sendable {
    static let logInterval: Millis = 10_000
    /// Answered for everything the store could not do: nothing changed, try
    /// again shortly.
    static let unavailable = HeraldError(.unavailable, "storage is unavailable; nothing was changed", retryAfterSeconds: 2)
    /// Answered when the store went away while committing: the change may
    /// have been made. A publish is safe to repeat (same appNotificationId).
    static let outcomeUnknown = HeraldError(.unavailable, "storage became unavailable while saving; the change may have been made",
                                            retryAfterSeconds: 2)

    /// What a use of the store asked of it.
    enum Use { case read, write }

    private struct State {
        var failingReads = false
        var failingWrites = false
        var failing: Bool { failingReads || failingWrites }
        var lastLog: Millis = 0
        var unlogged = 0
    }

    private let state = Mutex(State())
    private let clock: Clock

    init(clock: Clock) { self.clock = clock }

    public var isAvailable: Bool { state.withLock { !$0.failing } }

    func failed(_ use: Use, _ what: String, _ error: any Error) {
        let now = clock.ticks()
        let line: String? = state.withLock { s in
            switch use {
            case .read: s.failingReads = true
            case .write: s.failingWrites = true
            }
            guard now - s.lastLog >= Self.logInterval else {
                s.unlogged += 1
                return nil
            }
            defer { s.lastLog = now; s.unlogged = 0 }
            return "store: \(what) failed: \(error)" + (s.unlogged > 0 ? " (and \(s.unlogged) more failures since the last line)" : "")
        }
        if let line { Log.error(line) }
    }

    /// A write that committed says reads work too; a read says nothing of writes.
    func succeeded(_ use: Use) {
        let recovered = state.withLock { s -> Bool in
            guard s.failing else { return false }
            s.failingReads = false
            if use == .write { s.failingWrites = false }
            guard !s.failing else { return false }
            s.lastLog = 0
            s.unlogged = 0
            return true
        }
        if recovered { Log.info("store: available again") }
    }
}
