#include <curl/curl.h>

// curl_easy_setopt, curl_multi_setopt and curl_easy_getinfo are variadic,
// which Swift cannot call: one typed wrapper per argument kind.
static inline CURLcode herald_curl_setopt_long(CURL *c, CURLoption o, long v) { return curl_easy_setopt(c, o, v); }
static inline CURLcode herald_curl_setopt_off(CURL *c, CURLoption o, curl_off_t v) { return curl_easy_setopt(c, o, v); }
static inline CURLcode herald_curl_setopt_string(CURL *c, CURLoption o, const char *v) { return curl_easy_setopt(c, o, v); }
static inline CURLcode herald_curl_setopt_pointer(CURL *c, CURLoption o, void *v) { return curl_easy_setopt(c, o, v); }
static inline CURLcode herald_curl_setopt_slist(CURL *c, CURLoption o, struct curl_slist *v) { return curl_easy_setopt(c, o, v); }
// CURLOPT_WRITEFUNCTION and CURLOPT_HEADERFUNCTION share this signature.
static inline CURLcode herald_curl_setopt_write(CURL *c, CURLoption o, curl_write_callback v) { return curl_easy_setopt(c, o, v); }
static inline CURLcode herald_curl_getinfo_long(CURL *c, CURLINFO i, long *v) { return curl_easy_getinfo(c, i, v); }
static inline CURLMcode herald_multi_setopt_long(CURLM *m, CURLMoption o, long v) { return curl_multi_setopt(m, o, v); }
