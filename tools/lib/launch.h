/* tools/lib/launch.h — the command line that starts one actor instance, locally or remotely.
 *
 *   local: <bin_dir>/troupe-<role> --topology <abs path> --name <instance>
 *   ssh:   <the node's ssh template, split into words, {address}/{node} substituted> --
 *          'cd <workdir> && exec <bin> --topology <path> --name <instance>'   (one shell-quoted word)
 *   srun:  srun --nodes=1 --ntasks=1 --overlap --nodelist=<node> --job-name=troupe-<instance>
 *          [--chdir=<workdir>] <bin> --topology <path> --name <instance>
 *
 * bin_dir and topology_path are made absolute (joined to the current directory, not resolved)
 * because a remote node runs the same binaries at the same paths. A remote command changes to
 * the node's workdir, or to the supervisor's current directory when the node has none, so the
 * topology's relative paths (model.path, ...) mean the same thing there. With topology_path
 * NULL, --topology is left out and the actor loads the embedded default topology. */
#ifndef TROUPE_LAUNCH_H
#define TROUPE_LAUNCH_H

#include <stddef.h>

#include "topology/topology.h"

/* Builds a NULL-terminated argv (every string and the array malloc'd; free with
 * launch_free_argv). Returns 0, or -1 with err naming the problem. */
int launch_build_argv(const topo_t *t, const topo_instance_t *inst, const char *bin_dir,
                      const char *topology_path, char ***argv_out, char *err, size_t errlen);
void launch_free_argv(char ***argv_p);

/* s as one POSIX shell word: 'text' with every ' written '\''. Safe for any bytes but NUL.
 * Returns a malloc'd string, or NULL when out of memory. */
char *launch_shell_quote(const char *s);

/* Splits a command template into words the way a POSIX shell would for the quoting that
 * matters here: whitespace separates; '...' is literal; "..." keeps \" \\ \$ \` escapes;
 * a backslash outside quotes escapes the next character. No expansion of $, globs or ~.
 * Returns the word count and a malloc'd NULL-terminated array (free with launch_free_argv),
 * or -1 with err set (unterminated quote, out of memory). */
int launch_split_words(const char *tpl, char ***words_out, char *err, size_t errlen);

#endif
