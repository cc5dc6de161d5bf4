import HeraldCore

/// The engine's periodic store work: the expiry sweep (SPEC 3: expired
/// notifications announced within 2 s), presence across nodes, the
/// lastSeenAt flush, and pruning of old changes and lapsed registrations.
struct Maintenance {
    private var nextSweep: Millis = 0
    private var nextPrune: Millis = 0
    private var nextSeenFlush: Millis = 0

    mutating func run(_ e: Engine, now: Millis, force: Bool) {
        e.thread.assertCurrent()
        if now >= nextSweep || force {
            nextSweep = now + 250
            e.transaction("expiry sweep") { () throws(StoreError) in try Self.sweepExpired(e, now: now) }
        }
        e.cluster?.flush(e, now: now)
        if now >= nextSeenFlush || force {
            nextSeenFlush = now + 30_000
            e.transaction("lastSeen flush") { () throws(StoreError) in try Self.flushSeen(e, now: now) }
        }
        if now >= nextPrune {
            nextPrune = now + 600_000
            e.transaction("pruning") { () throws(StoreError) in
                let pruned = try e.store.pruneChanges(before: now - e.limits.changeRetentionSeconds * 1000)
                let lapsed = try e.store.pruneDevices(lastSeenBefore: now - e.limits.deviceLapseSeconds * 1000)
                if pruned + lapsed > 0 { Log.info("pruned \(pruned) old changes, \(lapsed) lapsed devices") }
            }
        }
    }

    private static func sweepExpired(_ e: Engine, now: Millis) throws(StoreError) {
        while true {
            let due = try e.store.expiring(until: now, limit: 500)
            for (user, n) in due {
                e.deliverAfterCommit(user, try e.store.delete(user, n, reason: .expired, at: now))
            }
            if due.count < 500 { return }
        }
    }

    private static func flushSeen(_ e: Engine, now: Millis) throws(StoreError) {
        let dirty = e.registry.unsavedSeen
        try e.store.claim(Array(dirty.keys))
        for (user, ids) in dirty {
            for var d in try e.store.devices(user) where ids.contains(d.deviceId) {
                if let seen = e.registry.connections(user, device: d.deviceId)?.lastSeenAt, seen > d.lastSeenAt {
                    d.lastSeenAt = seen
                    try e.store.saveDevice(user, d)
                }
            }
        }
        e.registry.flushed(now: now)
    }
}
