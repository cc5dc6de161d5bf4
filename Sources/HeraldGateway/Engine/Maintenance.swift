import Dispatch
import HeraldCore
import HeraldPorts

/// The engine's periodic store work: the sweep of deadlines (SPEC 3 and
/// 11: expired notifications deleted and snoozes ended within 2 s),
/// presence across nodes, the
/// lastSeenAt flush, pruning of old changes and lapsed registrations, and
/// with a bus the comparison of followed feeds with the store. Engine
/// thread only. The checks that run every few hundred milliseconds read on
/// the store's reader thread (`Engine.readAside`), so the engine is held
/// only when there is work: a database round trip per check would delay
/// every batch and bus delivery queued behind it.
final class Maintenance {
    let audit = FeedAudit()
    let devices = DeviceAudit()
    private var nextSweep: Millis = 0
    /// When the deadline check out on the reader thread was asked (a tick).
    private var checkingSince: Millis?
    /// A check found a notification due: the sweep runs at the next call.
    private var sweepDue = false
    private var nextPrune: Millis = 0
    private var nextDevicePrune: Millis = 0
    private var nextSeenFlush: Millis = 0
    private var nextStatistics: Millis = 0
    /// A statistics check is out on the reader thread.
    private var checkingStatistics = false
    /// Changes the open pruning round dropped so far (logged at its end).
    private var prunedInRound = 0

    /// Pruning runs every minute, in calls of at most `pruneChunk` changes
    /// spaced `pruneChunkSpacing` apart while any are left (up to 20,000
    /// changes a second). One call over the whole backlog held the engine,
    /// and every publish behind it, for as long as the backlog took (10 s
    /// for 1.2 million changes); on SQLite under load a call of 20,000
    /// changes took 100-250 ms, one of 2,000 25-50 ms (docs/BENCHMARKS.md,
    /// "Durable publishes for ten minutes").
    static let pruneEvery: Millis = 60_000
    static let pruneChunk = 1_000
    static let pruneChunkSpacing: Millis = 50
    /// How often the store checks its tables against the planner's statistics.
    static let statisticsEvery: Millis = 5_000
    /// How often the store is asked whether a notification is due (SPEC 3
    /// and 11: announced within 2 s of its expiry or its snooze's end).
    static let sweepEvery: Millis = 250
    /// A check still unanswered after this (the reader's queue long with
    /// catch-ups) gives way to a sweep on the engine, as before checks.
    static let checkPatience: Millis = 1_000

    /// `now`: wall time, for what is stored (expiry, cutoffs); `tick`
    /// (`Clock.ticks`): when each task is next due, so a step of the wall
    /// clock neither stops nor floods them.
    func run(_ e: Engine, now: Millis, tick: Millis, force: Bool) {
        e.thread.preconditionCurrent()
        if tick >= nextSweep || force {
            nextSweep = tick + Self.sweepEvery
            if force { sweepDue = true } else { checkDeadlines(e, now: now, tick: tick) }
        }
        if sweepDue {
            sweepDue = false
            e.transactions.run("deadline sweep") { tx throws(StoreError) in try Self.sweep(tx, e.share, now: now) }
        }
        e.cluster?.flush(e.transactions, now: now, tick: tick)
        if tick >= nextSeenFlush || force {
            nextSeenFlush = tick + 30_000
            e.transactions.run("lastSeen flush") { tx throws(StoreError) in try Self.flushSeen(tx, e.registry, now: now) }
        }
        if tick >= nextPrune && e.doesStoreWideWork { prune(e, now: now, tick: tick) }
        if tick >= nextStatistics {
            nextStatistics = tick + Self.statisticsEvery
            refreshStatistics(e)
        }
        if e.bus != nil {
            audit.run(e, tick: tick)
            devices.run(e, tick: tick)
        }
        if e.devicesStale { e.devicesStale = !e.refreshConnectedDevices() }
        e.push.run(e.transactions, now: now, tick: tick, storeWide: e.doesStoreWideWork)
        e.webhooks.run(e.transactions, now: now, tick: tick, storeWide: e.doesStoreWideWork)
    }

    /// Asks the store, off the engine, whether a notification expired or
    /// woke by `now`, unless the last question is still out: then, once it
    /// has been for `checkPatience`, sweeps anyway.
    private func checkDeadlines(_ e: Engine, now: Millis, tick: Millis) {
        if let asked = checkingSince {
            // Once per patience, not at every tick while it lasts.
            if tick - asked >= Self.checkPatience {
                sweepDue = true
                checkingSince = tick
            }
            return
        }
        checkingSince = tick
        e.readAside({ r throws(StoreError) in
            for d in Deadline.allCases { if let at = try r.next(d), at <= now { return true } }
            return false
        }) { e, result in
            let m = e.maintenance
            m.checkingSince = nil
            switch result {
            case .success(let due): if due { m.sweepDue = true }
            case .failure(let error): e.health.failed(.read, "deadline check", error)
            }
        }
    }

    /// A round of pruning calls; lapsed registrations go with its first
    /// call, or once a minute while a round lasts longer.
    private func prune(_ e: Engine, now: Millis, tick: Millis) {
        var pruned = Pruned(changes: 0, more: false), lapsed = 0
        let devicesDue = tick >= nextDevicePrune
        let limits = e.limits
        let committed = e.transactions.run("pruning") { tx throws(StoreError) in
            if devicesDue { lapsed = try tx.pruneDevices(lastSeenBefore: now - limits.deviceLapseSeconds * 1000) }
            pruned = try tx.pruneChanges(before: now - limits.changeRetentionSeconds * 1000, limit: Self.pruneChunk)
        }
        if committed && devicesDue {
            nextDevicePrune = tick + Self.pruneEvery
            if lapsed > 0 { Log.info("pruned \(lapsed) lapsed devices") }
        }
        if committed { prunedInRound += pruned.changes }
        // A call that failed ends the round too: the next round tries again.
        if committed && pruned.more {
            nextPrune = tick + Self.pruneChunkSpacing
            return
        }
        if prunedInRound > 0 { Log.info("pruned \(prunedInRound) old changes") }
        prunedInRound = 0
        nextPrune = tick + Self.pruneEvery
    }

    /// On the reader thread: an ANALYZE of a grown table takes tens of
    /// milliseconds, which every batch would have waited behind
    /// (docs/BENCHMARKS-HISTORY.md, "Round six"). No success reported: most stores
    /// have nothing to do here.
    private func refreshStatistics(_ e: Engine) {
        guard !checkingStatistics else { return }
        checkingStatistics = true
        e.readAside({ r throws(StoreError) in try r.refreshPlannerStatistics() }, vouches: false) { e, result in
            e.maintenance.checkingStatistics = false
            switch result {
            case .success(let analyzed):
                if !analyzed.isEmpty { Log.info("analyzed \(analyzed.joined(separator: ", ")): grown past the planner's statistics") }
            case .failure(let error): e.health.failed(.read, "planner statistics", error)
            }
        }
    }

    /// Expiry first, in the same transaction: a notification that expires
    /// before its snooze ends is deleted, not woken.
    private static func sweep(_ tx: FeedTransaction, _ share: Partition, now: Millis) throws(StoreError) {
        for deadline in Deadline.allCases {
            while true {
                let due = try tx.due(deadline, until: now, limit: 500, in: share)
                for (user, n) in due {
                    switch deadline {
                    case .expiry: _ = try tx.delete(user, n, reason: .expired, at: now, by: .herald)
                    case .wake: _ = try tx.wake(user, n, at: now)
                    }
                }
                if due.count < 500 { break }
            }
        }
    }

    private static func flushSeen(_ tx: FeedTransaction, _ registry: FollowerRegistry, now: Millis) throws(StoreError) {
        let dirty = registry.unsavedSeen
        try tx.claim(Array(dirty.keys))
        // One statement per 500 users, not a round trip per user.
        let registered = try tx.reads.devices(of: Array(dirty.keys))
        for (user, ids) in dirty {
            for d in registered[user] ?? [] where ids.contains(d.deviceId) {
                if let seen = registry.connections(user, device: d.deviceId)?.lastSeenAt, seen > d.lastSeenAt {
                    var saved = d
                    saved.lastSeenAt = seen
                    try tx.saveDevice(user, saved, was: d)
                }
            }
        }
        // Undone if the commit fails: run again, the flush must find them unsaved.
        tx.onRollback(registry.flushed(now: now))
    }
}
