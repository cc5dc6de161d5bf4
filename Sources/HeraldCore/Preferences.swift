/// The two ways a notification reaches a user (SPEC section 12).
public enum Channel: String, Sendable, CaseIterable { case inbox, push }

/// What a group (or the default) says of each channel; nil: it says nothing,
/// and the next rule decides.
public struct Channels: Sendable, Equatable {
    public var inbox: Bool?
    public var push: Bool?
    public init(inbox: Bool? = nil, push: Bool? = nil) { self.inbox = inbox; self.push = push }

    public subscript(_ c: Channel) -> Bool? {
        switch c {
        case .inbox: inbox
        case .push: push
        }
    }

    var json: JSON {
        var o = JSONObject()
        if let inbox { o["inbox"] = .bool(inbox) }
        if let push { o["push"] = .bool(push) }
        return .object(o)
    }

    /// `{"inbox"?, "push"?}`, booleans only: `null` and other keys are refused.
    init(reading json: JSON, what: String) throws(HeraldError) {
        guard let o = json.objectValue else { throw .badRequest("\(what) must be an object of inbox and push") }
        for (k, v) in o.pairs {
            guard let c = Channel(rawValue: k) else { throw .badRequest("\(what): unknown field \"\(k.prefix(64))\"") }
            guard let b = v.boolValue else { throw .badRequest("\(what).\(k) must be true or false") }
            switch c {
            case .inbox: inbox = b
            case .push: push = b
            }
        }
    }
}

/// A user's preferences (SPEC section 12): per notification group, whether
/// it reaches the inbox and pushes. Stores keep `default`, `groups`,
/// `version` and `updatedAt`; `critical` comes from the app's config
/// (`AppConfig.criticalGroups`) and is set where an answer is made.
public struct Preferences: Sendable, Equatable {
    public static let maxGroups = 100

    /// Both channels always set: a channel a save leaves out is `true`.
    public var `default`: Channels
    public var groups: [String: Channels]
    /// Groups that reach both channels whatever the user chose.
    public var critical: [String]
    /// 0 until first saved, +1 on every save.
    public var version: Int64
    /// nil until first saved.
    public var updatedAt: Millis?

    public init(default d: Channels = Channels(inbox: true, push: true), groups: [String: Channels] = [:],
                critical: [String] = [], version: Int64 = 0, updatedAt: Millis? = nil) {
        self.default = Channels(inbox: d.inbox ?? true, push: d.push ?? true)
        self.groups = groups; self.critical = critical; self.version = version; self.updatedAt = updatedAt
    }

    /// A user's who never saved any.
    public static let unsaved = Preferences()

    /// Whether a notification of `group` (nil: none) reaches `channel`: a
    /// critical group always does; else what its group says, else the default.
    public func allows(_ channel: Channel, group: String?) -> Bool {
        guard let group else { return self.default[channel] ?? true }
        if critical.contains(group) { return true }
        return groups[group]?[channel] ?? self.default[channel] ?? true
    }

    /// The same preferences with `critical` as the app's config names them.
    public func with(critical: [String]) -> Preferences {
        var p = self
        p.critical = critical
        return p
    }

    /// The wire form; groups in name order, so equal preferences encode alike.
    public var json: JSON {
        var groupsJSON = JSONObject()
        for name in groups.keys.sorted() { groupsJSON[name] = groups[name]!.json }
        return ["default": self.default.json, "groups": .object(groupsJSON),
                "critical": .array(critical.map(JSON.string)), "version": .int(version),
                "updatedAt": updatedAt.map { .string(RFC3339.format($0)) } ?? .null]
    }

    /// Reads the wire form back (a change in the feed, a stored row, an
    /// answer); nil if malformed.
    public init?(json: JSON) {
        guard let o = json.objectValue, let version = o["version"]?.int64Value,
              let d = o["default"].flatMap({ try? Channels(reading: $0, what: "default") }),
              let g = o["groups"]?.objectValue else { return nil }
        var groups: [String: Channels] = [:]
        for (name, v) in g.pairs {
            guard let c = try? Channels(reading: v, what: "group") else { return nil }
            groups[name] = c
        }
        var updatedAt: Millis? = nil
        if let s = o["updatedAt"]?.stringValue {
            guard let t = RFC3339.parse(s) else { return nil }
            updatedAt = t
        }
        let critical = o["critical"]?.arrayValue?.compactMap(\.stringValue) ?? []
        self.init(default: d, groups: groups, critical: critical, version: version, updatedAt: updatedAt)
    }

    /// A group name as a publish's `groupName` takes it (`NotificationDraft`).
    public static func isGroupName(_ s: String) -> Bool { !s.isEmpty && s.utf8.count <= Limits.maxGroupNameBytes }
}

/// `PUT .../preferences` (SPEC section 12): what a save replaces. An absent
/// key keeps what is saved; `null` anywhere is refused (`"groups": {}`
/// clears the groups), as are unknown keys, as everywhere in the API.
public struct PreferencesUpdate: Sendable, Equatable {
    public var `default`: Channels?
    public var groups: [String: Channels]?
    /// From `If-Match` (`StateUpdate.parseIfMatch`).
    public var ifVersion: Int64?

    public init(default d: Channels? = nil, groups: [String: Channels]? = nil, ifVersion: Int64? = nil) {
        self.default = d; self.groups = groups; self.ifVersion = ifVersion
    }

    public init(bytes: [UInt8], ifMatch: String?) throws(HeraldError) {
        var f = try Fields(bytes: bytes)
        for k in ["default", "groups"] where f.object[k]?.isNull == true {
            throw .badRequest("\(k) must not be null; leave it out to keep what is saved")
        }
        if let d = try f.object("default") { self.default = try Channels(reading: .object(d), what: "default") }
        if let g = try f.object("groups") {
            guard g.count <= Preferences.maxGroups else { throw .badRequest("at most \(Preferences.maxGroups) groups") }
            var out: [String: Channels] = [:]
            for (name, v) in g.pairs {
                guard Preferences.isGroupName(name) else {
                    throw .badRequest("a group name must be 1-\(Limits.maxGroupNameBytes) bytes, as groupName")
                }
                guard !v.isNull else { throw .badRequest("groups.\(name.prefix(64)) must not be null; leave it out to drop it") }
                out[name] = try Channels(reading: v, what: "groups.\(name.prefix(64))")
            }
            groups = out
        }
        try f.finish()
        guard self.default != nil || groups != nil else { throw .badRequest("give default or groups") }
        if let ifMatch { ifVersion = try StateUpdate.parseIfMatch(ifMatch, lowest: 0) }
    }

    /// The saved preferences after this save: version + 1.
    public func applied(to p: Preferences, now: Millis) -> Preferences {
        Preferences(default: self.default ?? p.default, groups: groups ?? p.groups, critical: p.critical,
                    version: p.version + 1, updatedAt: now)
    }
}
