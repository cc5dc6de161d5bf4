/// A feed position as a client sends it: a cursor and the epoch it belongs
/// to. No cursor asks for a reset; no epoch means the current one.
public struct FeedPosition: Sendable, Equatable {
    public var cursor: Int64?
    public var epoch: String?
    public init(cursor: Int64?, epoch: String?) { self.cursor = cursor; self.epoch = epoch }

    /// The cursor to resume from, or nil when the client must be reset.
    /// `current` is the epoch the viewer is given now.
    public func resumable(in feed: FeedState, epoch current: String) -> Int64? {
        guard let cursor else { return nil }
        if let epoch, epoch != current { return nil }
        return feed.accepts(cursor: cursor) ? cursor : nil
    }
}

/// WebSocket messages from a device (SPEC section 5).
public enum ClientMessage: Sendable, Equatable {
    case hello(token: String, deviceId: String, registration: DeviceRegistration, position: FeedPosition)
    case update(ref: String?, id: String, update: StateUpdate)
    case delete(ref: String?, id: String)
    case sync(ref: String?, position: FeedPosition)
    case refresh(ref: String?, token: String)
    case ping(ref: String?)

    public struct DecodeError: Error, Sendable, Equatable {
        public let ref: String?
        public let error: HeraldError
        public let isHello: Bool
        /// The hello had no usable token (close 4001 rather than 1008).
        public let missingToken: Bool
    }

    public static let maxTokenBytes = 8192

    public static func decode(_ json: JSON) -> Result<ClientMessage, DecodeError> {
        guard let o = json.objectValue else {
            return .failure(DecodeError(ref: nil, error: .badRequest("a message must be a JSON object"), isHello: false, missingToken: false))
        }
        let ref = o["ref"]?.stringValue
        let type = o["type"]?.stringValue
        do throws(HeraldError) {
            var f = try Fields(json)
            _ = try f.string("type", maxBytes: 32)
            let r = try f.string("ref", maxBytes: 256)
            let m: ClientMessage
            switch type {
            case "hello":
                guard let token = try? f.string("token", maxBytes: maxTokenBytes) else {
                    return .failure(DecodeError(ref: r, error: HeraldError(.unauthorized, "hello needs a token"), isHello: true, missingToken: true))
                }
                let device = try f.id("deviceId", required: true)!
                let reg = try DeviceRegistration(reading: &f)
                m = .hello(token: token, deviceId: device, registration: reg, position: try position(&f))
            case "update":
                var u = try StateUpdate(reading: &f)
                u.ifVersion = try f.int("ifVersion", in: 1...Int64.max)
                m = .update(ref: r, id: try notificationId(&f), update: u)
            case "delete": m = .delete(ref: r, id: try notificationId(&f))
            case "sync": m = .sync(ref: r, position: try position(&f))
            case "refresh": m = .refresh(ref: r, token: try f.requiredString("token", maxBytes: maxTokenBytes))
            case "ping": m = .ping(ref: r)
            case nil: throw .badRequest("a message needs a string type")
            case let t?: throw .badRequest("unknown message type \"\(t.prefix(32))\"")
            }
            try f.finish()
            return .success(m)
        } catch {
            return .failure(DecodeError(ref: ref, error: error, isHello: type == "hello", missingToken: false))
        }
    }

    static func position(_ f: inout Fields) throws(HeraldError) -> FeedPosition {
        FeedPosition(cursor: try f.int("cursor", in: 0...Int64.max), epoch: try f.string("epoch", maxBytes: 128))
    }

    static func notificationId(_ f: inout Fields) throws(HeraldError) -> String {
        try f.requiredString("id", maxBytes: 128)
    }
}

/// The answer to a write: the notification as the write left it (none
/// for a delete) and the feed's seq after it. Built from the change's bytes
/// when there is a change, so the notification is encoded once for the
/// store, the devices and the writer.
public struct WriteAnswer: Sendable {
    public let notification: ArraySlice<UInt8>?
    public let seq: Int64

    public init(_ r: ChangeRecord) { notification = r.notificationJSON; seq = r.seq }
    /// A write that changed nothing: `n` as it is, at the feed's `seq`.
    public init(unchanged n: Notification, seq: Int64) { notification = n.encoded[...]; self.seq = seq }

    /// `{"notification":…,"seq":N}` (SPEC sections 3 and 4).
    public var httpBody: [UInt8] {
        var out: [UInt8] = [UInt8(ascii: "{")]
        appendFields(to: &out)
        return out
    }

    /// `"notification":…,"seq":N}`: the fields, and the object's end.
    func appendFields(to out: inout [UInt8]) {
        out.reserveCapacity(out.count + (notification?.count ?? 0) + 40)
        if let notification {
            out.append(contentsOf: #""notification":"#.utf8)
            out.append(contentsOf: notification)
            out.append(UInt8(ascii: ","))
        }
        out.append(contentsOf: #""seq":\#(seq)}"#.utf8)
    }
}

/// Frames from the gateway (SPEC section 5), built as bytes. Changes are
/// spliced in already encoded, so a change is serialised once for all
/// devices.
public enum ServerFrame {
    private static let changesHead = Array(#"{"type":"changes","changes":["#.utf8)
    private static let changesCursor = Array(#"],"cursor":"#.utf8)
    private static let changeHead = Array(#"{"type":"change","change":"#.utf8)

    public static func changes(_ encoded: [[UInt8]], cursor: Int64) -> [UInt8] {
        var out: [UInt8] = []
        appendChanges(encoded[...], cursor: cursor, to: &out) { out, n in out.reserveCapacity(n) }
        return out
    }

    /// Appends a live frame (`change` for one, `changes` for several) straight
    /// into an output buffer, after `header(&out, length)`: the transport's
    /// framing needs the length first, and this spares building the frame
    /// apart and copying it.
    public static func appendLive(_ encoded: ArraySlice<[UInt8]>, cursor: Int64, to out: inout [UInt8],
                                  header: (inout [UInt8], Int) -> Void) {
        guard encoded.count == 1, let only = encoded.first else {
            return appendChanges(encoded, cursor: cursor, to: &out, header: header)
        }
        header(&out, changeHead.count + only.count + 1)
        out.append(contentsOf: changeHead)
        out.append(contentsOf: only)
        out.append(UInt8(ascii: "}"))
    }

    private static func appendChanges(_ encoded: ArraySlice<[UInt8]>, cursor: Int64, to out: inout [UInt8],
                                      header: (inout [UInt8], Int) -> Void) {
        let digits = String(cursor).utf8
        let body = encoded.reduce(max(encoded.count - 1, 0)) { $0 + $1.count }
        header(&out, changesHead.count + body + changesCursor.count + digits.count + 1)
        out.append(contentsOf: changesHead)
        for (k, c) in encoded.enumerated() {
            if k > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: c)
        }
        out.append(contentsOf: changesCursor)
        out.append(contentsOf: digits)
        out.append(UInt8(ascii: "}"))
    }

    /// `notifications`: already encoded, spliced in as they are.
    /// `preferences` (encoded) go in the final frame only (SPEC section 12).
    public static func reset(_ notifications: [[UInt8]], cursor: Int64, epoch: String, final: Bool,
                             preferences: [UInt8]) -> [UInt8] {
        var out = Array(#"{"type":"reset","notifications":"#.utf8)
        appendArray(notifications, to: &out)
        out.append(contentsOf: ",\"cursor\":\(cursor),\"epoch\":".utf8)
        JSON.encodeString(epoch, into: &out)
        if final {
            out.append(contentsOf: ",\"preferences\":".utf8)
            out.append(contentsOf: preferences)
        }
        out.append(contentsOf: ",\"final\":\(final)}".utf8)
        return out
    }

    /// `[a,b,...]` of encoded values.
    public static func appendArray(_ encoded: [[UInt8]], to out: inout [UInt8]) {
        out.reserveCapacity(out.count + encoded.reduce(2 + encoded.count) { $0 + $1.count })
        out.append(UInt8(ascii: "["))
        for (k, c) in encoded.enumerated() {
            if k > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: c)
        }
        out.append(UInt8(ascii: "]"))
    }

    public static func welcome(cursor: Int64, epoch: String, connectionId: String, badge: Badge) -> [UInt8] {
        JSON.object(["type": "welcome", "cursor": .int(cursor), "epoch": .string(epoch),
                     "connectionId": .string(connectionId), "unread": .int(badge.unread), "unseen": .int(badge.unseen)]).encoded
    }

    public static func ack(ref: String?, extra: JSONObject) -> [UInt8] {
        var o: JSONObject = ["type": "ack", "ref": ref.json]
        for (k, v) in extra.pairs { o[k] = v }
        return JSON.object(o).encoded
    }

    /// The `ack` of an `update` or `delete`.
    public static func ack(ref: String?, _ w: WriteAnswer) -> [UInt8] {
        var out = Array(#"{"type":"ack","ref":"#.utf8)
        ref.json.encode(into: &out)
        out.append(UInt8(ascii: ","))
        w.appendFields(to: &out)
        return out
    }

    public static func error(ref: String?, _ e: HeraldError) -> [UInt8] {
        JSON.object(["type": "error", "ref": ref.json, "code": .string(e.code.rawValue), "message": .string(e.message)]).encoded
    }

    /// Sent after most changes, so written directly.
    public static func counts(_ badge: Badge) -> [UInt8] {
        Array(#"{"type":"counts","unread":\#(badge.unread),"unseen":\#(badge.unseen)}"#.utf8)
    }

    public static func pong(ref: String?) -> [UInt8] {
        JSON.object(["type": "pong", "ref": ref.json]).encoded
    }

    public static func tokenExpiring(_ at: Millis) -> [UInt8] {
        JSON.object(["type": "tokenExpiring", "expiresAt": .string(RFC3339.format(at))]).encoded
    }
}

/// History page tokens (`next` / `before`): the position of the last
/// notification on the page, so a token stays valid when that notification
/// is deleted.
public enum PageToken {
    public static func encode(_ k: HistoryKey) -> String {
        Base64URL.encode(Array("\(k.createdAt):\(k.id)".utf8))
    }

    public static func decode(_ s: String) -> HistoryKey? {
        guard s.utf8.count <= 256, let bytes = Base64URL.decode(Substring(s)),
              let text = String(validating: bytes, as: UTF8.self),
              let colon = text.firstIndex(of: ":"),
              let ms = Int64(text[..<colon]) else { return nil }
        let id = String(text[text.index(after: colon)...])
        guard NotificationID.isWellFormed(id) else { return nil }
        return HistoryKey(createdAt: ms, id: id)
    }
}
