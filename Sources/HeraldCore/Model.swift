public enum ReadState: String, Sendable, CaseIterable { case unread, read }
/// Whether the user has been shown a notification, apart from reading it (SPEC section 11).
public enum SeenState: String, Sendable, CaseIterable {
    case unseen, seen

    /// What a notification stored before `seenState` existed counts as, and
    /// the default of a notification built without one: read ones `seen`,
    /// unread ones `unseen` (a user who never opened the bell has not seen
    /// them). docs/PROTOCOL.md documents this.
    public static func implied(by r: ReadState) -> SeenState { r == .read ? .seen : .unseen }
}
public enum UserActionState: String, Sendable, CaseIterable { case noInteraction, activated, dismissed, snoozed }
/// A time a stored notification may have that the store sweeps for: when
/// it expires (deleted) and when its snooze ends (woken, SPEC section 11).
public enum Deadline: Sendable, CaseIterable { case expiry, wake }
public enum Priority: String, Sendable, CaseIterable { case normal, high }
public enum Platform: String, Sendable, CaseIterable { case web, ios, android, windows, other }

/// A user's identity inside one app: the unit of every feed, lock and fan-out.
public struct UserKey: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let app: String
    public let user: String
    public init(app: String, user: String) { self.app = app; self.user = user }
    public var description: String { "\(app)/\(user)" }
    public static func < (a: UserKey, b: UserKey) -> Bool { (a.app, a.user) < (b.app, b.user) }
}

/// Who may see a notification: its `targetPlatforms` and `targetTags`.
public struct Targeting: Sendable, Equatable {
    public let platforms: [Platform]?
    public let tags: TagExpression?
    public init(platforms: [Platform]?, tags: TagExpression?) { self.platforms = platforms; self.tags = tags }
    public static let everyone = Targeting(platforms: nil, tags: nil)

    public func admits(_ viewer: Viewer) -> Bool {
        guard let device = viewer.device else { return true }
        if let platforms, !platforms.contains(device.platform) { return false }
        if let tags, !tags.matches(device.has) { return false }
        return true
    }
}

public struct Notification: Sendable, Equatable, JSONWritable {
    public var id: String
    public var appNotificationId: String
    public var userId: String
    public var payload: JSONObject
    public var priority: Priority
    public var groupName: String?
    public var displayTimeToLive: Int64?
    public var targetPlatforms: [Platform]?
    public var targetTags: TagExpression?
    public var createdAt: Millis
    public var updatedAt: Millis
    public var expiresAt: Millis
    public var readState: ReadState
    public var seenState: SeenState
    public var userActionState: UserActionState
    /// When a snooze ends (SPEC section 11); nil unless snoozed until a time.
    public var snoozedUntil: Millis?
    public var version: Int64

    public init(id: String, appNotificationId: String, userId: String, payload: JSONObject,
                priority: Priority = .normal, groupName: String? = nil, displayTimeToLive: Int64? = nil,
                targetPlatforms: [Platform]? = nil, targetTags: TagExpression? = nil,
                createdAt: Millis, updatedAt: Millis, expiresAt: Millis,
                readState: ReadState = .unread, seenState: SeenState? = nil, userActionState: UserActionState = .noInteraction,
                snoozedUntil: Millis? = nil, version: Int64 = 1) {
        self.id = id; self.appNotificationId = appNotificationId; self.userId = userId; self.payload = payload
        self.priority = priority; self.groupName = groupName; self.displayTimeToLive = displayTimeToLive
        self.targetPlatforms = targetPlatforms; self.targetTags = targetTags
        self.createdAt = createdAt; self.updatedAt = updatedAt; self.expiresAt = expiresAt
        self.readState = readState; self.seenState = seenState ?? .implied(by: readState)
        self.userActionState = userActionState; self.snoozedUntil = snoozedUntil; self.version = version
    }

    public var targeting: Targeting { Targeting(platforms: targetPlatforms, tags: targetTags) }

    /// When `deadline` falls for it, if it has one.
    public func at(_ deadline: Deadline) -> Millis? {
        switch deadline {
        case .expiry: expiresAt
        case .wake: snoozedUntil
        }
    }

    /// Its snooze ended (SPEC section 11): back as if new to the user.
    public func woken(at now: Millis) -> Notification {
        var m = self
        m.userActionState = .noInteraction
        m.readState = .unread
        m.seenState = .unseen
        m.snoozedUntil = nil
        m.version += 1
        m.updatedAt = now
        return m
    }

    /// The wire form of SPEC section 1, keys in the documented order,
    /// written straight to bytes: every change carries it, and building a
    /// `JSON` tree first cost a publish about 30,000 instructions.
    public func encode(into out: inout [UInt8]) {
        func put(_ s: StaticString) { out.append(contentsOf: UnsafeBufferPointer(start: s.utf8Start, count: s.utf8CodeUnitCount)) }
        func string(_ s: String?) { if let s { JSON.encodeString(s, into: &out) } else { put("null") } }
        func number(_ n: Int64?) { if let n { out.append(contentsOf: String(n).utf8) } else { put("null") } }
        func time(_ t: Millis) { out.append(0x22); RFC3339.append(t, to: &out); out.append(0x22) }
        put(#"{"id":"#); string(id)
        put(#","appNotificationId":"#); string(appNotificationId)
        put(#","userId":"#); string(userId)
        put(#","payload":"#); JSON.object(payload).encode(into: &out)
        put(#","priority":"#); string(priority.rawValue)
        put(#","groupName":"#); string(groupName)
        put(#","displayTimeToLive":"#); number(displayTimeToLive)
        put(#","targetPlatforms":"#)
        if let targetPlatforms {
            out.append(UInt8(ascii: "["))
            for (k, p) in targetPlatforms.enumerated() {
                if k > 0 { out.append(UInt8(ascii: ",")) }
                string(p.rawValue)
            }
            out.append(UInt8(ascii: "]"))
        } else {
            put("null")
        }
        put(#","targetTags":"#); string(targetTags?.source)
        put(#","createdAt":"#); time(createdAt)
        put(#","updatedAt":"#); time(updatedAt)
        put(#","expiresAt":"#); time(expiresAt)
        put(#","readState":"#); string(readState.rawValue)
        put(#","seenState":"#); string(seenState.rawValue)
        put(#","userActionState":"#); string(userActionState.rawValue)
        put(#","snoozedUntil":"#)
        if let snoozedUntil { time(snoozedUntil) } else { put("null") }
        put(#","version":"#); number(version)
        out.append(UInt8(ascii: "}"))
    }

    /// The wire form as a JSON value, read back from `encoded` (which is
    /// valid JSON by construction, its depth bounded by how it was built):
    /// for the few places that nest it.
    public var json: JSON { try! JSONParser.parse(encoded, maxDepth: .max) }

    /// Reads back the wire form (stores keep notifications as their JSON).
    public init?(json: JSON) {
        guard let o = json.objectValue,
              let id = o["id"]?.stringValue, let anid = o["appNotificationId"]?.stringValue,
              let uid = o["userId"]?.stringValue, let payload = o["payload"]?.objectValue,
              let pr = o["priority"]?.stringValue.flatMap(Priority.init(rawValue:)),
              let c = o["createdAt"]?.stringValue.flatMap(RFC3339.parse),
              let u = o["updatedAt"]?.stringValue.flatMap(RFC3339.parse),
              let e = o["expiresAt"]?.stringValue.flatMap(RFC3339.parse),
              let rs = o["readState"]?.stringValue.flatMap(ReadState.init(rawValue:)),
              let us = o["userActionState"]?.stringValue.flatMap(UserActionState.init(rawValue:)),
              let v = o["version"]?.int64Value
        else { return nil }
        // Absent from what was stored before it existed (`SeenState.implied`).
        var seen: SeenState? = nil
        if let text = o["seenState"] {
            guard let s = text.stringValue.flatMap(SeenState.init(rawValue:)) else { return nil }
            seen = s
        }
        // Absent from what was stored before it existed: not snoozed until a time.
        var until: Millis? = nil
        if let text = o["snoozedUntil"], !text.isNull {
            guard let t = text.stringValue.flatMap(RFC3339.parse) else { return nil }
            until = t
        }
        var platforms: [Platform]? = nil
        if let arr = o["targetPlatforms"]?.arrayValue {
            platforms = arr.compactMap { $0.stringValue.flatMap(Platform.init(rawValue:)) }
        }
        let tags = o["targetTags"]?.stringValue.flatMap { try? TagExpression.parse($0) }
        self.init(id: id, appNotificationId: anid, userId: uid, payload: payload, priority: pr,
                  groupName: o["groupName"]?.stringValue, displayTimeToLive: o["displayTimeToLive"]?.int64Value,
                  targetPlatforms: platforms, targetTags: tags, createdAt: c, updatedAt: u, expiresAt: e,
                  readState: rs, seenState: seen, userActionState: us, snoozedUntil: until, version: v)
    }
}

/// A registered device (SPEC sections 4 and 8).
public struct Device: Sendable, Equatable {
    public var deviceId: String
    public var platform: Platform
    /// Tags the device set itself; the built-in ones are derived.
    public var tags: [String]
    public var lastSeenAt: Millis
    /// Counts changes of platform or tags. It is part of the epoch the device
    /// is given, so a device whose view changed gets a reset, not changes
    /// that never told it of notifications it can now see.
    public var viewGeneration: Int64
    /// Where the device is woken while it holds no connection (SPEC section 10).
    public var push: PushHandle?

    public init(deviceId: String, platform: Platform = .other, tags: [String] = [], lastSeenAt: Millis, viewGeneration: Int64 = 0,
                push: PushHandle? = nil) {
        self.deviceId = deviceId; self.platform = platform; self.tags = tags; self.lastSeenAt = lastSeenAt
        self.viewGeneration = viewGeneration; self.push = push
    }

    public static let reservedTagPrefixes = ["user:", "platform:", "device:"]

    public func allTags(userId: String) -> [String] {
        ["user:\(userId)", "platform:\(platform.rawValue)", "device:\(deviceId)"] + tags
    }
}

/// What one client may see. An HTTP client that names no device sees
/// everything its user may see (`device == nil`).
public struct Viewer: Sendable, Equatable {
    public struct DeviceView: Sendable, Equatable {
        public let userId: String
        public let deviceId: String
        public let platform: Platform
        /// The device's own tags; the built-in ones are answered by `has`
        /// from the fields above (a set of them was ~120 bytes a connection).
        public let tags: Set<String>
        public let viewGeneration: Int64

        /// Whether the device carries `tag`, its built-in ones included
        /// (SPEC section 8: `user:`, `platform:`, `device:`).
        public func has(_ tag: String) -> Bool {
            if tag.hasPrefix("user:") { return tag.dropFirst(5) == userId }
            if tag.hasPrefix("platform:") { return tag.dropFirst(9) == platform.rawValue }
            if tag.hasPrefix("device:") { return tag.dropFirst(7) == deviceId }
            return tags.contains(tag)
        }
    }
    public let device: DeviceView?

    public static let unnamed = Viewer(device: nil)

    public init(device: DeviceView?) { self.device = device }
    public init(userId: String, device: Device) {
        self.device = DeviceView(userId: userId, deviceId: device.deviceId, platform: device.platform,
                                 tags: Set(device.tags), viewGeneration: device.viewGeneration)
    }

    /// The epoch this viewer is given for a store epoch (see `Device.viewGeneration`).
    public func epoch(store: String) -> String {
        guard let g = device?.viewGeneration, g > 0 else { return store }
        return "\(store).\(g)"
    }
}
