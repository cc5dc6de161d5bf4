import CCrypto
import Foundation
import HeraldCore
import XCTest

extension Array where Element == UInt8 {
    init(hex: String) {
        let digits = Array(hex.utf8)
        self = stride(from: 0, to: digits.count, by: 2).map { UInt8(String(decoding: digits[$0..<$0 + 2], as: UTF8.self), radix: 16)! }
    }

    var hex: String { map { String(format: "%02x", $0) }.joined() }
}

func b64url(_ s: String) -> [UInt8] { Base64URL.decode(Substring(s))! }

/// Runs `python3 -c script args...` (python3 from PATH) with `input` on stdin
/// and answers its standard output; fails the test when it exits non-zero.
/// The cross-checks need the http_ece, cryptography and PyJWT packages.
func python(_ script: String, _ args: [String], input: [UInt8] = [],
            file: StaticString = #filePath, line: UInt = #line) throws -> String {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = ["python3", "-c", script] + args
    let stdin = Pipe(), stdout = Pipe(), stderr = Pipe()
    process.standardInput = stdin
    process.standardOutput = stdout
    process.standardError = stderr
    try process.run()
    stdin.fileHandleForWriting.write(Data(input))
    try stdin.fileHandleForWriting.close()
    // Python's answers and tracebacks are far below a pipe's buffer, so reading one after the other cannot stall.
    let out = stdout.fileHandleForReading.readDataToEndOfFile()
    let err = stderr.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    if process.terminationStatus != 0 {
        XCTFail("python3 exited \(process.terminationStatus) (the cross-checks need `pip install http-ece cryptography PyJWT`):\n"
                + String(decoding: err, as: UTF8.self), file: file, line: line)
    }
    return String(decoding: out, as: UTF8.self)
}

/// libcrypto's own check of a SHA-256 signature (DER for ECDSA).
func verifySHA256(key: OpaquePointer, message: [UInt8], signature: [UInt8]) -> Bool {
    let ctx = EVP_MD_CTX_new()
    defer { EVP_MD_CTX_free(ctx) }
    guard EVP_DigestVerifyInit(ctx, nil, EVP_sha256(), nil, key) == 1 else { return false }
    return EVP_DigestVerify(ctx, signature, signature.count, message, message.count) == 1
}

/// JOSE r || s back to DER, independently of the code under test.
func derSignature(jose: [UInt8]) -> [UInt8] {
    let sig = ECDSA_SIG_new()
    defer { ECDSA_SIG_free(sig) }
    ECDSA_SIG_set0(sig, BN_bin2bn(jose, 32, nil), BN_bin2bn(Array(jose[32...]), 32, nil))
    var der = [UInt8](repeating: 0, count: Int(i2d_ECDSA_SIG(sig, nil)))
    der.withUnsafeMutableBufferPointer { buf in
        var p = buf.baseAddress
        _ = i2d_ECDSA_SIG(sig, &p)
    }
    return der
}
