"""Named by a recipe of test_clusters: importing it takes long (at most 120 s) and says so
first, so a test can interrupt `kerastrain launch` before any task has started."""

import time

print("slow import: started", flush=True)
time.sleep(120)
