/* coderun pause: the pod sandbox's first process.
 *
 * Holds the pod's namespaces open by sleeping in pause(); exits cleanly on
 * SIGINT/SIGTERM and reaps zombies when it is PID 1 of a shared PID namespace.
 * Built with gcc -static so the image needs nothing but this file.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_terminate(int sig) {
    (void)sig;
    _exit(0);
}

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction terminate = {.sa_handler = on_terminate};
    struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    if (sigaction(SIGINT, &terminate, NULL) < 0 || sigaction(SIGTERM, &terminate, NULL) < 0 ||
        sigaction(SIGCHLD, &child, NULL) < 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
