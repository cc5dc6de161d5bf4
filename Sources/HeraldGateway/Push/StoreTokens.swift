import HeraldCore
import HeraldPorts

/// `SharedTokens` in the first partition's store: the database every node
/// of a PostgreSQL deployment shares, the SQLite file, a memory store's
/// process.
struct StoreTokens: SharedTokens {
    let engine: Engine

    func token(_ name: String, renewAfter: Millis, make: @escaping @Sendable (Millis) -> String,
               completion: @escaping @Sendable (SharedToken?) -> Void) {
        engine.exchange({ e throws(StoreError) in
            let now = e.clock.now()
            let kept = try e.reads.sharedToken(name)
            if let kept, now - kept.issuedAt < renewAfter { return kept }
            let made = SharedToken(value: make(now), issuedAt: now)
            if try e.tx.replaceSharedToken(name, with: made, replacing: kept?.issuedAt) { return made }
            // Another process renewed it a moment ago.
            return try e.reads.sharedToken(name)
        }, reply: { completion($0 ?? nil) })
    }
}
