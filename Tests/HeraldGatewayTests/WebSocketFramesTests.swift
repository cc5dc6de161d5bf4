import XCTest
@testable import HeraldGateway

/// RFC 6455 section 5 rules the reader enforces, one case each.
final class WebSocketFramesTests: XCTestCase {
    func frame(_ b0: UInt8, _ payload: [UInt8], masked: Bool = true, length: [UInt8]? = nil) -> [UInt8] {
        let mask: [UInt8] = [9, 8, 7, 6]
        let len = length ?? (payload.count < 126 ? [UInt8(payload.count)] : [126, UInt8(payload.count >> 8), UInt8(payload.count & 0xff)])
        return [b0, (masked ? 0x80 : 0) | len[0]] + len.dropFirst() + (masked ? mask : [])
            + payload.enumerated().map { masked ? $0.element ^ mask[$0.offset & 3] : $0.element }
    }

    func read(_ bytes: [UInt8], max: Int = 100) -> [WebSocketEvent] {
        var r = WebSocketFrameReader(maxMessage: max)
        var out: [WebSocketEvent] = []
        bytes.withUnsafeBytes { r.read($0) { out.append($0) } }
        return out
    }

    func testMessagesFragmentsAndControlFrames() {
        let t = Array("hello".utf8)
        XCTAssertEqual(read(frame(0x81, t)), [.text(t)])
        XCTAssertEqual(read(frame(0x01, [104, 101]) + frame(0x89, [7]) + frame(0x80, [108, 108, 111])), [.ping([7]), .text(t)])
        XCTAssertEqual(read(frame(0x8A, []) + frame(0x81, [])), [.pong, .text([])])
        XCTAssertEqual(read(frame(0x88, [3, 232]) + frame(0x81, t)), [.close([3, 232])], "nothing is read after a close")
        XCTAssertEqual(read(frame(0x82, [1, 2]) + frame(0x81, t)), [.binary, .text(t)], "a binary message is skipped")
    }

    func testLimitCountsFragmentsTogether() {
        let half = [UInt8](repeating: 65, count: 60)
        XCTAssertEqual(read(frame(0x01, half) + frame(0x80, half) + frame(0x81, [66])), [.tooBig, .text([66])])
        XCTAssertEqual(read(frame(0x81, half + half.prefix(40))), [.text(half + half.prefix(40))], "exactly the limit is taken")
    }

    func testTheLargestLengthAfterAFragmentIsTooBigNotAnOverflow() {
        // 2^63 - 1 bytes announced behind one byte of the message: the sum
        // of the two does not fit an Int.
        let largest: [UInt8] = [127, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]
        XCTAssertEqual(read(frame(0x01, [97]) + frame(0x80, [], length: largest)), [.tooBig])
        XCTAssertEqual(read(frame(0x81, [], length: largest)), [.tooBig])
    }

    /// RFC 6455 5.5.1, 7.4 and 8.1: what a client's close frame may hold.
    func testTheAnswerToAClientsCloseFrameReadsItsBody() {
        func answer(_ code: Int, _ reason: [UInt8] = []) -> CloseCode {
            WebSocketSession.answer(toClose: [UInt8(code >> 8), UInt8(code & 0xff)] + reason).code
        }
        XCTAssertEqual(WebSocketSession.answer(toClose: []).code, .normal, "no body: no code")
        XCTAssertEqual(WebSocketSession.answer(toClose: [3]).code, .protocolError, "a 1-byte body")
        for ok in [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999] {
            XCTAssertEqual(answer(ok), .normal, "\(ok)")
        }
        for bad in [0, 1, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535] {
            XCTAssertEqual(answer(bad), .protocolError, "\(bad)")
        }
        XCTAssertEqual(answer(1000, Array("bye, ünd 😀".utf8)), .normal)
        for notUTF8: [UInt8] in [[0xff], [0xce, 0xba, 0xe1], [0xed, 0xa0, 0x80], [0xc0, 0x80]] {
            XCTAssertEqual(answer(1000, notUTF8), .invalidPayload, "\(notUTF8)")
        }
        XCTAssertEqual(answer(1004, [0xff]), .protocolError, "the code is read first")
    }

    func testCloseReasonsAreCutAtACharacter() {
        for reason in [String(repeating: "é", count: 70), "x" + String(repeating: "é", count: 70), String(repeating: "😀", count: 40)] {
            let cut = WebSocketSession.closeReason(reason)
            XCTAssertLessThanOrEqual(cut.utf8.count, 120)
            XCTAssertGreaterThan(cut.utf8.count, 116, "only the partial character goes")
            XCTAssertTrue(reason.hasPrefix(cut))
        }
        XCTAssertEqual(WebSocketSession.closeReason("short"), "short")
    }

    func testFramingErrors() {
        func refused(_ bytes: [UInt8], _ why: String) {
            guard case .protocolError(let m)? = read(bytes).last, m.contains(why) else {
                return XCTFail("\(read(bytes)) is not a protocol error about \(why)")
            }
        }
        refused(frame(0x81, [1], masked: false), "masked")
        refused(frame(0xC1, [1]), "reserved")
        refused(frame(0x83, [1]), "opcode")
        refused(frame(0x80, [1]), "continuation")
        refused(frame(0x01, [1]) + frame(0x81, [1]), "inside a fragmented")
        refused(frame(0x09, [1]), "control frames")
        refused(frame(0x89, [UInt8](repeating: 0, count: 126)), "control frames")
        refused(frame(0x81, [], length: [127, 0x80, 0, 0, 0, 0, 0, 0, 0]), "length")
    }
}
