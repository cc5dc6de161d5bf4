/// Limits of SPEC sections 1, 3 and 8.
public enum Limits {
    public static let maxPayloadBytes = 64 * 1024
    public static let day: Int64 = 86_400
    public static let defaultExpirySeconds: Int64 = 30 * day
    public static let maxExpirySeconds: Int64 = 365 * day
    public static let maxDeviceTags = 60
    public static let maxBulkUsers = 1000
    public static let maxGroupNameBytes = 256
}

/// The notification fields of a publish (SPEC section 3).
public struct NotificationDraft: Sendable, Equatable {
    public enum Expiry: Sendable, Equatable { case `default`, ttl(Int64), at(Millis) }

    public var appNotificationId: String
    public var payload: JSONObject
    public var priority: Priority = .normal
    public var groupName: String?
    public var displayTimeToLive: Int64?
    public var targetPlatforms: [Platform]?
    public var targetTags: TagExpression?
    public var expiry: Expiry = .default

    public init(appNotificationId: String, payload: JSONObject) {
        self.appNotificationId = appNotificationId; self.payload = payload
    }

    /// Reads the draft's fields; the caller calls `finish()`.
    public init(reading f: inout Fields) throws(HeraldError) {
        appNotificationId = try f.id("appNotificationId", required: true)!
        guard let payload = try f.object("payload") else { throw .badRequest("payload is required and must be a JSON object") }
        // The payload's encoding is no longer than its text, which lies
        // within the body's: a body within the limit need not be encoded to
        // be measured (a 64 KiB payload's encoding is a fifth of its publish).
        guard f.textLength ?? .max <= Limits.maxPayloadBytes || JSON.object(payload).encoded.count <= Limits.maxPayloadBytes else {
            throw HeraldError(.tooLarge, "payload is larger than 64 KiB encoded")
        }
        self.payload = payload
        priority = try f.enumValue("priority", Priority.self) ?? .normal
        if let g = try f.string("groupName", maxBytes: Limits.maxGroupNameBytes) {
            guard !g.isEmpty else { throw .badRequest("groupName must not be empty") }
            groupName = g
        }
        displayTimeToLive = try f.int("displayTimeToLive", in: 0...Limits.maxExpirySeconds)
        if let arr = try f.array("targetPlatforms") {
            var ps: [Platform] = []
            for v in arr {
                guard let p = v.stringValue.flatMap(Platform.init(rawValue:)) else {
                    throw .badRequest("targetPlatforms entries must be one of \(Platform.allCases.map(\.rawValue).joined(separator: ", "))")
                }
                if !ps.contains(p) { ps.append(p) }
            }
            targetPlatforms = ps
        }
        if let t = try f.string("targetTags", maxBytes: 4096) { targetTags = try Self.expression(t, field: "targetTags") }
        let ttl = try f.int("ttlSeconds", in: 1...Limits.maxExpirySeconds)
        let at = try f.time("expiresAt")
        switch (ttl, at) {
        case (.some, .some): throw .badRequest("give expiresAt or ttlSeconds, not both")
        case (.some(let t), nil): expiry = .ttl(t)
        case (nil, .some(let ms)): expiry = .at(ms)
        case (nil, nil): expiry = .default
        }
    }

    public static func expression(_ text: String, field: String) throws(HeraldError) -> TagExpression {
        do { return try TagExpression.parse(text) } catch { throw .badRequest("\(field): \(error.description)") }
    }

    public func expiresAt(now: Millis) throws(HeraldError) -> Millis {
        switch expiry {
        case .default: return now + Limits.defaultExpirySeconds * 1000
        case .ttl(let s): return now + s * 1000
        case .at(let ms):
            guard ms > now else { throw .badRequest("expiresAt must be in the future") }
            guard ms <= now + Limits.maxExpirySeconds * 1000 else { throw .badRequest("expiresAt must be within 365 days") }
            return ms
        }
    }

    /// The notification this draft makes: new, or replacing `existing`
    /// (keeps id and createdAt, resets state, version + 1).
    public func notification(replacing existing: Notification?, userId: String, now: Millis) throws(HeraldError) -> Notification {
        let exp = try expiresAt(now: now)
        return Notification(
            id: existing?.id ?? NotificationID.make(now: now), appNotificationId: appNotificationId, userId: userId,
            payload: payload, priority: priority, groupName: groupName, displayTimeToLive: displayTimeToLive,
            targetPlatforms: targetPlatforms, targetTags: targetTags,
            createdAt: existing?.createdAt ?? now, updatedAt: now, expiresAt: exp,
            readState: .unread, seenState: .unseen, userActionState: .noInteraction, version: (existing?.version ?? 0) + 1)
    }
}

/// `POST /v1/apps/{app}/notifications`: many users at once.
public struct BulkSend: Sendable {
    public enum Audience: Sendable, Equatable { case users([String]), tags(TagExpression) }
    public let audience: Audience
    public let draft: NotificationDraft

    public init(bytes: [UInt8]) throws(HeraldError) {
        var f = try Fields(bytes: bytes)
        let ids = try f.array("userIds")
        let expr = try f.string("tagExpression", maxBytes: 4096)
        switch (ids, expr) {
        case (.some, .some): throw .badRequest("give userIds or tagExpression, not both")
        case (nil, nil): throw .badRequest("userIds or tagExpression is required")
        case (.some(let arr), nil):
            var seen = Set<String>(), users: [String] = []
            for v in arr {
                guard let s = v.stringValue, Identifiers.isUserId(s) else { throw .badRequest("userIds holds a bad user id") }
                if seen.insert(s).inserted { users.append(s) }
                // Duplicates count once; stop early on a huge array.
                guard users.count <= Limits.maxBulkUsers else { break }
            }
            guard (1...Limits.maxBulkUsers).contains(users.count) else { throw .badRequest("userIds must hold 1 to 1000 distinct ids") }
            audience = .users(users)
        case (nil, .some(let e)):
            audience = .tags(try NotificationDraft.expression(e, field: "tagExpression"))
        }
        var d = try NotificationDraft(reading: &f)
        if case .tags(let e) = audience {
            guard !f.has("targetTags") else { throw .badRequest("an app-wide send by tagExpression sets targetTags itself") }
            d.targetTags = e
        }
        try f.finish()
        // Validate the expiry now so a bad one is refused before the 202.
        _ = try d.expiresAt(now: WallClock.now())
        draft = d
    }
}

/// A device's state change (HTTP PATCH and WebSocket `update`).
public struct StateUpdate: Sendable, Equatable {
    public var readState: ReadState?
    public var seenState: SeenState?
    public var userActionState: UserActionState?
    /// When a snooze ends (SPEC section 11): with `snoozed`, or alone on a
    /// notification already snoozed (it moves the time).
    public var snoozedUntil: Millis?
    public var ifVersion: Int64?

    /// How far ahead a snooze may end (SPEC section 11).
    public static let maxSnoozeMillis: Millis = 365 * 86_400_000

    public init(readState: ReadState? = nil, seenState: SeenState? = nil, userActionState: UserActionState? = nil,
                snoozedUntil: Millis? = nil, ifVersion: Int64? = nil) {
        self.readState = readState; self.seenState = seenState; self.userActionState = userActionState
        self.snoozedUntil = snoozedUntil; self.ifVersion = ifVersion
    }

    init(reading f: inout Fields) throws(HeraldError) {
        readState = try f.enumValue("readState", ReadState.self)
        seenState = try f.enumValue("seenState", SeenState.self)
        userActionState = try f.enumValue("userActionState", UserActionState.self)
        snoozedUntil = try f.time("snoozedUntil")
        guard readState != nil || seenState != nil || userActionState != nil || snoozedUntil != nil else {
            throw .badRequest("give readState, seenState, userActionState or snoozedUntil")
        }
        // Reading it is seeing it (SPEC section 11): the two cannot disagree.
        if readState == .read && seenState == .unseen {
            throw .badRequest("readState read makes it seen; seenState unseen contradicts it")
        }
        if snoozedUntil != nil, let a = userActionState, a != .snoozed {
            throw .badRequest("snoozedUntil goes with userActionState snoozed, not \(a.rawValue)")
        }
    }

    /// What only the notification and the time can refuse: a snooze time
    /// in the past or more than 365 days ahead, or one for a notification
    /// that is not snoozed and is not being snoozed.
    public func check(against n: Notification, now: Millis) throws(HeraldError) {
        guard let until = snoozedUntil else { return }
        guard userActionState == .snoozed || n.userActionState == .snoozed else {
            throw .badRequest("snoozedUntil needs userActionState snoozed: this notification is \(n.userActionState.rawValue)")
        }
        guard until > now else { throw .badRequest("snoozedUntil must be in the future") }
        guard until - now <= Self.maxSnoozeMillis else { throw .badRequest("snoozedUntil must be within 365 days") }
    }

    public init(bytes: [UInt8], ifMatch: String?) throws(HeraldError) {
        var f = try Fields(bytes: bytes)
        try self.init(reading: &f)
        try f.finish()
        if let ifMatch { ifVersion = try Self.parseIfMatch(ifMatch) }
    }

    /// `If-Match: "3"` (quotes optional); `lowest`: the first version
    /// there is (preferences start at 0, unsaved).
    public static func parseIfMatch(_ s: String, lowest: Int64 = 1) throws(HeraldError) -> Int64 {
        var t = Substring(s).trimmingSpaces
        if t.hasPrefix("W/") { t = t.dropFirst(2) }
        if t.count >= 2, t.first == "\"", t.last == "\"" { t = t.dropFirst().dropLast() }
        guard !t.isEmpty, t.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let v = Int64(t), v >= lowest else {
            throw .badRequest("If-Match must be a version number such as \"3\"")
        }
        return v
    }

    /// Applies to `n`; nil when nothing would change.
    public func applied(to n: Notification, now: Millis) -> Notification? {
        var m = n
        if let r = readState { m.readState = r }
        // Marking it read also makes it seen (one change); unread again leaves it seen.
        if let s = seenState ?? (readState == .read ? .seen : nil) { m.seenState = s }
        if let a = userActionState {
            m.userActionState = a
            // Snoozed without a time stays snoozed until something changes it.
            m.snoozedUntil = nil
        }
        if let t = snoozedUntil { m.snoozedUntil = t }
        guard m.readState != n.readState || m.seenState != n.seenState || m.userActionState != n.userActionState
                || m.snoozedUntil != n.snoozedUntil else { return nil }
        m.version += 1
        m.updatedAt = now
        return m
    }
}

/// `PUT /v1/me/devices/{id}` and the device fields of `hello`.
public struct DeviceRegistration: Sendable, Equatable {
    public var platform: Platform?
    public var tags: [String]?
    /// nil: keep the registered handle.
    public var push: PushUpdate?

    public init(platform: Platform? = nil, tags: [String]? = nil, push: PushUpdate? = nil) {
        self.platform = platform; self.tags = tags; self.push = push
    }

    init(reading f: inout Fields) throws(HeraldError) {
        platform = try f.enumValue("platform", Platform.self)
        if let arr = try f.array("tags") {
            var out: [String] = []
            for v in arr {
                guard let t = v.stringValue, Identifiers.isTag(t) else {
                    throw .badRequest("tags must be 1-160 characters of A-Z a-z 0-9 _ @ # . : -")
                }
                guard !Device.reservedTagPrefixes.contains(where: { t.hasPrefix($0) }) else {
                    throw .badRequest("tags starting with user:, platform: or device: are built in")
                }
                if !out.contains(t) { out.append(t) }
                guard out.count <= Limits.maxDeviceTags else { throw .badRequest("a device has at most 60 tags") }
            }
            tags = out
        }
        // `"push": null` removes the handle, where other fields take null as absent.
        if f.object["push"]?.isNull == true {
            _ = f.raw("push")
            push = .remove
        } else if let p = try f.object("push") {
            push = .set(try PushHandle(json: .object(p)))
        }
    }

    public init(bytes: [UInt8]) throws(HeraldError) {
        if bytes.allSatisfy({ $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 }) { self.init(); return }
        var f = try Fields(bytes: bytes)
        try self.init(reading: &f)
        try f.finish()
    }

    public func applied(to d: Device?, deviceId: String, now: Millis) -> Device {
        var out = d ?? Device(deviceId: deviceId, lastSeenAt: now)
        if let platform { out.platform = platform }
        if let tags { out.tags = tags }
        switch push {
        case .set(let h): out.push = h
        case .remove: out.push = nil
        case nil: break
        }
        // Tag order carries no meaning: only a different set changes what the device sees.
        if let d, d.platform != out.platform || Set(d.tags) != Set(out.tags) { out.viewGeneration += 1 }
        out.lastSeenAt = now
        return out
    }
}

/// `POST /v1/apps/{app}/tokens`.
public struct TokenRequest: Sendable {
    public static let ttlRange: ClosedRange<Int64> = 60...2_592_000
    public let userId: String
    public let ttlSeconds: Int64
    public let deviceId: String?

    public init(bytes: [UInt8]) throws(HeraldError) {
        var f = try Fields(bytes: bytes)
        userId = try f.id("userId", required: true)!
        ttlSeconds = try f.int("ttlSeconds", in: Self.ttlRange) ?? 3600
        deviceId = try f.id("deviceId")
        try f.finish()
    }
}

extension Substring {
    /// Without leading and trailing spaces and tabs (HTTP's optional whitespace).
    public var trimmingSpaces: Substring {
        var s = self
        while s.first == " " || s.first == "\t" { s = s.dropFirst() }
        while s.last == " " || s.last == "\t" { s = s.dropLast() }
        return s
    }
}
