/* tools/keygen.c — troupe-keygen: makes a CURVE keypair for a Troupe client or cluster.
 *
 *   troupe-keygen PREFIX     writes PREFIX.pub (the public key, Z85) and PREFIX.key (the secret
 *                            key), both 0600, and prints the public key
 *
 * The cluster's client-facing pair goes to security.curve_server_public / _secret; a client's
 * public key goes into the security.curve_clients allow-list (docs/security.md).
 * Exit codes: 0 written, 1 an error (named), 2 bad usage. */
#include <stdio.h>
#include <string.h>

#include "actors/runtime/auth.h"

int main(int argc, char **argv)
{
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(argc == 2 && !strcmp(argv[1], "--help") ? stdout : stderr,
                "usage: troupe-keygen PREFIX\n  writes a CURVE keypair: PREFIX.pub and PREFIX.key (0600)\n");
        return argc == 2 && !strcmp(argv[1], "--help") ? 0 : 2;
    }
    if (!auth_curve_available()) {
        fprintf(stderr, "troupe-keygen: this libzmq has no CURVE\n");
        return 1;
    }
    char pub[4096], sec[4096], err[512];
    snprintf(pub, sizeof pub, "%s.pub", argv[1]);
    snprintf(sec, sizeof sec, "%s.key", argv[1]);
    auth_keypair_t kp;
    if (auth_keypair_generate(pub, sec, &kp, err, sizeof err) != 0) {
        fprintf(stderr, "troupe-keygen: %s\n", err);
        return 1;
    }
    printf("%s\n", kp.pub);
    return 0;
}
