#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/x509_vfy.h>

// Macros over SSL_ctrl and SSL_CTX_ctrl, which Swift cannot call.
// OpenSSL copies the name: it need not outlive the call.
static inline int herald_ssl_set_sni(SSL *s, const char *name) { return (int)SSL_set_tlsext_host_name(s, name); }
static inline int herald_ssl_ctx_min_tls12(SSL_CTX *c) { return (int)SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION); }
