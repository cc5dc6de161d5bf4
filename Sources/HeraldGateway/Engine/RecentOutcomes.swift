import HeraldCore

/// The last few outcomes of each of many keys (a device's pushes, a
/// webhook endpoint's failures), for the inspector (docs/PROTOCOL.md
/// section 18). Held in memory by the engine that saw them: per node and
/// partition, lost at restart. Bounded twice: `perKey` outcomes a key,
/// `keys` keys; past that the least recently noted half is dropped at once,
/// so a full map costs one sort per `keys / 2` notes, not a scan per note.
/// Engine thread only, as its owner's other state.
struct RecentOutcomes<Key: Hashable> {
    let perKey: Int
    let keys: Int
    private var rings: [Key: (stamp: Int, outcomes: [RecentOutcome])] = [:]
    private var stamp = 0

    init(perKey: Int, keys: Int) { self.perKey = perKey; self.keys = keys }

    mutating func note(_ key: Key, _ o: RecentOutcome) {
        stamp += 1
        var ring = rings[key]?.outcomes ?? []
        if ring.count == perKey { ring.removeFirst() }
        ring.append(o)
        rings[key] = (stamp, ring)
        guard rings.count > keys else { return }
        let cut = rings.values.map(\.stamp).sorted()[rings.count / 2]
        rings = rings.filter { $0.value.stamp >= cut }
    }

    /// `key`'s outcomes, newest first.
    func recent(_ key: Key) -> [RecentOutcome] { (rings[key]?.outcomes ?? []).reversed() }
}

/// One of `RecentOutcomes`' entries.
struct RecentOutcome {
    let at: Millis
    /// What happened (`delivered`, `unregistered`, `failed`...).
    let outcome: String
    /// The service's reason code, from a bounded set: never the
    /// service's free text, which may quote a handle (an APNs URL
    /// holds its device token).
    let reason: String?

    var json: JSON { ["at": .string(RFC3339.format(at)), "outcome": .string(outcome), "reason": reason.map(JSON.string) ?? .null] }
}
