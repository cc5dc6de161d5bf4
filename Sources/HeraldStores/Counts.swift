import HeraldCore

extension Targeting {
    /// The platforms as a set, in `Platform.allCases` order: targetings that
    /// differ only in the order or repeats of platforms count together.
    var canonical: Targeting {
        Targeting(platforms: platforms.map { ps in Platform.allCases.filter(ps.contains) }, tags: tags)
    }
}

/// A targeting as counts group it: platforms as a set, tags by source. Both
/// parts are text so that SQLite can key rows by them (NOT NULL, hence no
/// NULL for "everyone").
struct TargetingKey: Hashable {
    /// "*" for every platform, else the platforms in `Platform.allCases`
    /// order, comma-separated ("" for none).
    let platforms: String
    /// The tag expression's source, "" for every device (a valid source is
    /// never empty).
    let tags: String

    init(platforms: String, tags: String) { self.platforms = platforms; self.tags = tags }

    /// Every platform, every device.
    static let everyone = TargetingKey(platforms: "*", tags: "")

    init(_ t: Targeting) {
        platforms = t.canonical.platforms.map { $0.map(\.rawValue).joined(separator: ",") } ?? "*"
        tags = t.tags?.source ?? ""
    }

    /// The canonical targeting this key stands for; nil when a part does not
    /// parse (a damaged row).
    var targeting: Targeting? {
        var platforms: [Platform]? = nil
        if self.platforms != "*" {
            var list: [Platform] = []
            for name in self.platforms.split(separator: ",") {
                guard let p = Platform(rawValue: String(name)) else { return nil }
                list.append(p)
            }
            platforms = list
        }
        var tags: TagExpression? = nil
        if !self.tags.isEmpty {
            guard let t = try? TagExpression.parse(self.tags) else { return nil }
            tags = t
        }
        return Targeting(platforms: platforms, tags: tags)
    }
}

/// What one live notification adds to its user's counts.
struct Counted {
    let key: TargetingKey
    /// Canonical (see `Targeting.canonical`).
    let targeting: Targeting
    let unread: Bool
    let unseen: Bool
    let noInteraction: Bool

    init(targeting: Targeting, unread: Bool, unseen: Bool, noInteraction: Bool) {
        key = TargetingKey(targeting)
        self.targeting = targeting.canonical
        self.unread = unread
        self.unseen = unseen
        self.noInteraction = noInteraction
    }

    init(_ n: Notification) {
        self.init(targeting: n.targeting, unread: n.readState == .unread, unseen: n.seenState == .unseen,
                  noInteraction: n.userActionState == .noInteraction)
    }
}

/// How one write moves the count of one targeting.
struct CountDelta {
    let key: TargetingKey
    let targeting: Targeting
    var unread: Int
    var unseen: Int
    var noInteraction: Int
    var total: Int

    init(key: TargetingKey, targeting: Targeting, unread: Int, unseen: Int, noInteraction: Int, total: Int) {
        self.key = key; self.targeting = targeting
        self.unread = unread; self.unseen = unseen; self.noInteraction = noInteraction; self.total = total
    }

    private init(_ c: Counted, _ sign: Int) {
        self.init(key: c.key, targeting: c.targeting, unread: c.unread ? sign : 0, unseen: c.unseen ? sign : 0,
                  noInteraction: c.noInteraction ? sign : 0, total: sign)
    }

    var negated: CountDelta {
        CountDelta(key: key, targeting: targeting, unread: -unread, unseen: -unseen, noInteraction: -noInteraction, total: -total)
    }

    /// The deltas of replacing `old` (nil: nothing was stored) by `new`
    /// (nil: a delete): at most one per targeting, none that changes nothing
    /// (a payload-only replace writes no count).
    static func replacing(_ old: Counted?, by new: Counted?) -> [CountDelta] {
        var out: [CountDelta] = []
        if let old { out.append(CountDelta(old, -1)) }
        if let new {
            if let i = out.firstIndex(where: { $0.key == new.key }) {
                out[i].unread += new.unread ? 1 : 0
                out[i].unseen += new.unseen ? 1 : 0
                out[i].noInteraction += new.noInteraction ? 1 : 0
                out[i].total += 1
            } else {
                out.append(CountDelta(new, 1))
            }
        }
        return out.filter { $0.unread != 0 || $0.unseen != 0 || $0.noInteraction != 0 || $0.total != 0 }
    }
}
