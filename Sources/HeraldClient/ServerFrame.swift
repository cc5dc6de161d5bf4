import HeraldCore

/// One message from the gateway (PROTOCOL.md 6.5), read completely before
/// anything is applied: a frame that does not parse changes nothing.
enum ServerFrame {
    case changes([Change], cursor: Int64?)
    /// `preferences`: in the final frame, from a gateway that has them.
    case reset([HeraldNotification], cursor: Int64, epoch: String, final: Bool, preferences: Preferences?)
    case welcome(cursor: Int64, epoch: String, unread: Int)
    case counts(unread: Int)
    /// `ack` and `pong`: the answer to the request named by `ref`.
    case answer(ref: String?, body: JSONObject)
    case error(ref: String?, code: String, message: String)
    case tokenExpiring
    case unknown(type: String)

    static func parse(_ text: String) -> Result<ServerFrame, HeraldClientError> {
        guard let json = try? JSONParser.parse(text), let o = json.objectValue else {
            return .failure(.badFrame("not a JSON object: \(text.prefix(80))"))
        }
        guard let type = o["type"]?.stringValue else { return .failure(.badFrame("a frame without a type")) }
        let frame: ServerFrame?
        switch type {
        case "changes":
            frame = o["changes"]?.arrayValue.flatMap { list in
                let changes = list.compactMap(Change.init(json:))
                return changes.count == list.count ? .changes(changes, cursor: o["cursor"]?.int64Value) : nil
            }
        case "change":
            frame = o["change"].flatMap(Change.init(json:)).map { .changes([$0], cursor: nil) }
        case "reset":
            if let list = o["notifications"]?.arrayValue, let cursor = o["cursor"]?.int64Value,
               let epoch = o["epoch"]?.stringValue, let final = o["final"]?.boolValue {
                let ns = list.compactMap(HeraldNotification.init(json:))
                let preferences = o["preferences"].flatMap(Preferences.init(json:))
                frame = ns.count == list.count ? .reset(ns, cursor: cursor, epoch: epoch, final: final, preferences: preferences) : nil
            } else { frame = nil }
        case "welcome":
            if let cursor = o["cursor"]?.int64Value, let epoch = o["epoch"]?.stringValue,
               let unread = o["unread"]?.int64Value {
                frame = .welcome(cursor: cursor, epoch: epoch, unread: Int(unread))
            } else { frame = nil }
        case "counts":
            frame = o["unread"]?.int64Value.map { .counts(unread: Int($0)) }
        case "ack", "pong":
            frame = .answer(ref: o["ref"]?.stringValue, body: o)
        case "error":
            frame = .error(ref: o["ref"]?.stringValue, code: o["code"]?.stringValue ?? "unknown",
                           message: o["message"]?.stringValue ?? "")
        case "tokenExpiring":
            frame = .tokenExpiring
        default:
            frame = .unknown(type: type)
        }
        return frame.map { .success($0) } ?? .failure(.badFrame("a malformed \(type) frame"))
    }
}

