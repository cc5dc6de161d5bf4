import XCTest
import HeraldCore

/// `ClientMessage.decode` fed from parsed JSON (WebSocket text frames).
final class ProtocolFuzzTests: XCTestCase {

    static let target = FuzzTarget(
        name: "message",
        extraCorpora: ["json", "token"],
        dictionary: wireWords,
        jsonAware: true,
        maxLength: 262144,
        check: { bytes in
            guard let json = try? JSONParser.parse(bytes) else { return .rejected }
            return checkMessage(json)
        })

    func testFuzzClientMessageDecode() {
        FuzzRunner.run(Self.target, test: self)
    }

    static func checkMessage(_ json: JSON) -> Outcome {
        let o = json.objectValue
        let rawRef = o?["ref"]?.stringValue
        let type = o?["type"]?.stringValue
        switch ClientMessage.decode(json) {
        case .failure(let e):
            // A clear error: bad_request, or unauthorized for a hello
            // without a usable token (close 4001); the ref echoed when the
            // client sent a string one; isHello exactly for hellos.
            guard e.error.code == .badRequest || (e.error.code == .unauthorized && e.isHello && e.missingToken) else {
                return .failed("decode error with code \(e.error.code.rawValue) (hello=\(e.isHello), missingToken=\(e.missingToken))")
            }
            guard !e.error.message.isEmpty else { return .failed("decode error without a message") }
            guard e.isHello == (type == "hello") else { return .failed("isHello=\(e.isHello) for type \(type ?? "nil")") }
            if e.missingToken, !e.isHello { return .failed("missingToken on a non-hello") }
            if let rawRef, e.ref != rawRef { return .failed("ref \(rawRef.debugDescription) echoed as \(e.ref.debugDescription)") }
            if rawRef == nil, e.ref != nil { return .failed("a ref appeared from nowhere") }
            return .rejected
        case .success(let m):
            if let why = invariants(m, type: type) { return .failed(why) }
            // Re-encoding the decoded message decodes to the same message.
            let again = encode(m)
            guard case .success(let m2) = ClientMessage.decode(again) else {
                return .failed("re-encoded message does not decode: \(again.encodedString.prefix(300))")
            }
            guard m2 == m else { return .failed("re-encoded message decodes differently: \(m) vs \(m2)") }
            return .accepted
        }
    }

    static func invariants(_ m: ClientMessage, type: String?) -> String? {
        func ref(_ r: String?) -> String? { r.flatMap { $0.utf8.count > 256 ? "ref over 256 bytes" : nil } }
        func pos(_ p: FeedPosition) -> String? {
            if let c = p.cursor, c < 0 { return "negative cursor" }
            if let e = p.epoch, e.utf8.count > 128 { return "epoch over 128 bytes" }
            return nil
        }
        switch m {
        case .hello(let token, let deviceId, let reg, let p):
            guard type == "hello" else { return "decoded hello from type \(type ?? "nil")" }
            if token.utf8.count > ClientMessage.maxTokenBytes { return "token over the limit" }
            if !Identifiers.isUserId(deviceId) { return "bad deviceId accepted: \(deviceId.debugDescription)" }
            return InputsFuzzTests.registrationProblem(reg) ?? pos(p)
        case .update(let r, let id, let u):
            guard type == "update" else { return "decoded update from \(type ?? "nil")" }
            if id.utf8.count > 128 { return "id over 128 bytes" }
            if u.readState == nil, u.userActionState == nil { return "update without a state" }
            if let v = u.ifVersion, v < 1 { return "ifVersion < 1" }
            return ref(r)
        case .delete(let r, let id):
            guard type == "delete" else { return "decoded delete from \(type ?? "nil")" }
            return id.utf8.count > 128 ? "id over 128 bytes" : ref(r)
        case .sync(let r, let p):
            guard type == "sync" else { return "decoded sync from \(type ?? "nil")" }
            return ref(r) ?? pos(p)
        case .refresh(let r, let token):
            guard type == "refresh" else { return "decoded refresh from \(type ?? "nil")" }
            return token.utf8.count > ClientMessage.maxTokenBytes ? "token over the limit" : ref(r)
        case .ping(let r):
            guard type == "ping" else { return "decoded ping from \(type ?? "nil")" }
            return ref(r)
        }
    }

    /// The message as a client would send it (SPEC section 5).
    static func encode(_ m: ClientMessage) -> JSON {
        var o = JSONObject()
        func put(_ k: String, _ v: JSON?) { if let v { o[k] = v } }
        func position(_ p: FeedPosition) { put("cursor", p.cursor.map { .int($0) }); put("epoch", p.epoch.map { .string($0) }) }
        switch m {
        case .hello(let token, let deviceId, let reg, let p):
            o["type"] = "hello"; o["token"] = .string(token); o["deviceId"] = .string(deviceId)
            put("platform", reg.platform.map { .string($0.rawValue) })
            put("tags", reg.tags.map { .array($0.map(JSON.string)) })
            position(p)
        case .update(let r, let id, let u):
            o["type"] = "update"; put("ref", r.map(JSON.string)); o["id"] = .string(id)
            put("readState", u.readState.map { .string($0.rawValue) })
            put("userActionState", u.userActionState.map { .string($0.rawValue) })
            put("ifVersion", u.ifVersion.map { .int($0) })
        case .delete(let r, let id):
            o["type"] = "delete"; put("ref", r.map(JSON.string)); o["id"] = .string(id)
        case .sync(let r, let p):
            o["type"] = "sync"; put("ref", r.map(JSON.string)); position(p)
        case .refresh(let r, let token):
            o["type"] = "refresh"; put("ref", r.map(JSON.string)); o["token"] = .string(token)
        case .ping(let r):
            o["type"] = "ping"; put("ref", r.map(JSON.string))
        }
        return .object(o)
    }
}
