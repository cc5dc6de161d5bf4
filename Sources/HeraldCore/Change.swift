public enum DeleteReason: String, Sendable { case deleted, expired, hidden }

/// One entry of a user's change feed (SPEC section 1).
public struct Change: Sendable, Equatable {
    public enum Op: Sendable, Equatable {
        case upsert(Notification)
        case delete(id: String, appNotificationId: String, reason: DeleteReason)
        /// A save of the user's preferences (SPEC section 12), `critical`
        /// as the app's config named them then.
        case preferences(Preferences)
    }
    public let seq: Int64
    public let op: Op

    public init(seq: Int64, op: Op) { self.seq = seq; self.op = op }

    /// Reads a change in its wire form (SPEC section 1), as gateways send it,
    /// stores keep it and the bus carries it; nil if malformed.
    public init?(json: JSON) {
        guard let o = json.objectValue, let seq = o["seq"]?.int64Value else { return nil }
        switch o["op"]?.stringValue {
        case "upsert":
            guard let n = o["notification"].flatMap(Notification.init(json:)) else { return nil }
            self.init(seq: seq, op: .upsert(n))
        case "delete":
            guard let id = o["id"]?.stringValue, let anid = o["appNotificationId"]?.stringValue,
                  let reason = o["reason"]?.stringValue.flatMap(DeleteReason.init(rawValue:)) else { return nil }
            self.init(seq: seq, op: .delete(id: id, appNotificationId: anid, reason: reason))
        case "preferences":
            guard let p = o["preferences"].flatMap(Preferences.init(json:)) else { return nil }
            self.init(seq: seq, op: .preferences(p))
        default:
            return nil
        }
    }

    public var json: JSON {
        switch op {
        case .upsert(let n):
            return ["seq": .int(seq), "op": "upsert", "notification": n.json]
        case .delete(let id, let anid, let reason):
            return ["seq": .int(seq), "op": "delete", "id": .string(id), "appNotificationId": .string(anid),
                    "reason": .string(reason.rawValue)]
        case .preferences(let p):
            return ["seq": .int(seq), "op": "preferences", "preferences": p.json]
        }
    }
}

/// A device's badge counts (SPEC sections 4, 5 and 11): its unread and
/// unseen notifications, or how a change moves them.
public struct Badge: Sendable, Equatable {
    public var unread: Int
    public var unseen: Int
    public init(unread: Int = 0, unseen: Int = 0) { self.unread = unread; self.unseen = unseen }
    public static let zero = Badge()
    public var isZero: Bool { self == .zero }
    public static func + (a: Badge, b: Badge) -> Badge { Badge(unread: a.unread + b.unread, unseen: a.unseen + b.unseen) }
    public static func - (a: Badge, b: Badge) -> Badge { Badge(unread: a.unread - b.unread, unseen: a.unseen - b.unseen) }
    public static func += (a: inout Badge, b: Badge) { a = a + b }
}

/// Whether a notification was there for a viewer, and unread and unseen:
/// enough to tell each device what a change means to it without
/// per-device state.
public struct Presence: Sendable, Equatable {
    public let targeting: Targeting
    public let unread: Bool
    public let unseen: Bool
    public init(targeting: Targeting, unread: Bool, unseen: Bool) {
        self.targeting = targeting; self.unread = unread; self.unseen = unseen
    }
    public init(_ n: Notification) {
        self.init(targeting: n.targeting, unread: n.readState == .unread, unseen: n.seenState == .unseen)
    }

    /// What it adds to a badge.
    public var badge: Badge { Badge(unread: unread ? 1 : 0, unseen: unseen ? 1 : 0) }

    /// The form the bus carries (keys as in a notification).
    public var json: JSON {
        ["unread": .bool(unread), "unseen": .bool(unseen),
         "targetPlatforms": targeting.platforms.map { .array($0.map { .string($0.rawValue) }) } ?? .null,
         "targetTags": targeting.tags.map { .string($0.source) } ?? .null]
    }

    /// `unseen` absent (from a node before it existed): as `unread` implies
    /// (`SeenState.implied`).
    public init?(json: JSON) {
        guard let o = json.objectValue, let unread = o["unread"]?.boolValue else { return nil }
        var platforms: [Platform]? = nil
        if let list = o["targetPlatforms"]?.arrayValue {
            platforms = list.compactMap { $0.stringValue.flatMap(Platform.init(rawValue:)) }
            guard platforms?.count == list.count else { return nil }
        }
        var tags: TagExpression? = nil
        if let source = o["targetTags"]?.stringValue {
            guard let t = try? TagExpression.parse(source) else { return nil }
            tags = t
        }
        self.init(targeting: Targeting(platforms: platforms, tags: tags), unread: unread, unseen: o["unseen"]?.boolValue ?? unread)
    }
}

/// A change as the feed keeps it: with the notification's presence before
/// and after it, so each device gets its own view of the feed, and with its
/// JSON encoded once for every device that receives it.
public struct ChangeRecord: Sendable {
    public let change: Change
    /// nil for a new notification.
    public let before: Presence?
    /// nil for a delete.
    public let after: Presence?
    public let at: Millis
    public let encoded: [UInt8]

    public init(change: Change, before: Presence?, after: Presence?, at: Millis) {
        self.init(change: change, before: before, after: after, at: at, encoded: Self.encode(change))
    }

    /// For a change read back from storage with its wire bytes: `encoded`
    /// must be `change.json.encoded`. Spares a catch-up re-encoding every
    /// change it sends.
    public init(change: Change, before: Presence?, after: Presence?, at: Millis, encoded: [UInt8]) {
        self.change = change; self.before = before; self.after = after; self.at = at; self.encoded = encoded
    }

    public var seq: Int64 { change.seq }

    /// `change.json.encoded`, with an upsert's notification encoded straight
    /// after the fixed prefix, so `notificationJSON` can find it again. The
    /// SQL stores read notifications back from stored changes by this
    /// layout (`notificationRange`): changing it needs schema migrations.
    private static func encode(_ change: Change) -> [UInt8] {
        guard case .upsert(let n) = change.op else { return change.json.encoded }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(512)  // a small notification's change, grown in one step
        appendUpsertPrefix(change.seq, to: &bytes)
        n.encode(into: &bytes)
        bytes.append(UInt8(ascii: "}"))
        return bytes
    }

    private static func appendUpsertPrefix(_ seq: Int64, to out: inout [UInt8]) {
        out.append(contentsOf: #"{"seq":"#.utf8)
        out.append(contentsOf: String(seq).utf8)
        out.append(contentsOf: #","op":"upsert","notification":"#.utf8)
    }

    private static func upsertPrefix(_ seq: Int64) -> [UInt8] {
        var bytes: [UInt8] = []
        appendUpsertPrefix(seq, to: &bytes)
        return bytes
    }

    /// An upsert's notification as encoded inside `encoded` (nil for a
    /// delete): the answer to the write reuses these bytes rather than
    /// encoding the notification again (a 64 KiB payload cost ~0.1 ms per
    /// encoding). `encoded` has `Change.json`'s layout, as `encode` and
    /// every stored record (written from it) have.
    public var notificationJSON: ArraySlice<UInt8>? {
        guard case .upsert = change.op else { return nil }
        let start = Self.upsertPrefixLength + String(seq).utf8.count
        return encoded[start ..< encoded.count - 1]
    }

    /// Where the notification lies in `encoded`, read back as the upsert at
    /// `seq`; nil unless it has that upsert's layout: the SQL stores keep a
    /// notification only inside its change.
    public static func notificationRange(inUpsert seq: Int64, of encoded: UnsafeBufferPointer<UInt8>) -> Range<Int>? {
        let prefix = upsertPrefix(seq)
        guard encoded.count > prefix.count + 1, encoded.last == UInt8(ascii: "}"), encoded.starts(with: prefix) else { return nil }
        return prefix.count ..< encoded.count - 1
    }

    /// `upsertPrefix`'s length without the seq's digits.
    private static let upsertPrefixLength = upsertPrefix(0).count - 1

    /// The encoded change `viewer` receives: the change itself, a `hidden`
    /// delete when an upsert retargeted away a notification the viewer could
    /// see, or nil when the viewer may not see it at all. Preferences are
    /// the user's, not a notification's: every device receives them, so
    /// that every one shows the same switches (SPEC section 12).
    public func bytes(for viewer: Viewer) -> [UInt8]? {
        if case .preferences = change.op { return encoded }
        if after?.targeting.admits(viewer) ?? false { return encoded }
        guard before?.targeting.admits(viewer) ?? false else { return nil }
        if case .upsert(let n) = change.op {
            return Change(seq: seq, op: .delete(id: n.id, appNotificationId: n.appNotificationId, reason: .hidden)).json.encoded
        }
        return encoded
    }

    /// How this change moves `viewer`'s unread and unseen counts.
    public func badgeDelta(for viewer: Viewer) -> Badge {
        func counted(_ p: Presence?) -> Badge { p.flatMap { $0.targeting.admits(viewer) ? $0.badge : nil } ?? .zero }
        return counted(after) - counted(before)
    }
}
