/* The errno of the last failed system call, kept per thread for pt_last_errno(): shared by
 * every platform profile, and by the rooms above for the system calls they make themselves
 * (sockets, threads). */
#include <errno.h>

#include "platform/platform.h"

static _Thread_local int last_errno;

int pt_last_errno(void) { return last_errno; }

pt_status_t pt__sys(void)
{
    last_errno = errno;
    return PT_ERR_SYS;
}
