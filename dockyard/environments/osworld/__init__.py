"""OSWorld computer use: the pyautogui action space (read, never run), a client of OSWorld's VM
controller API, and the desktop simulator service that stands in for OSWorld's VMs here.

The environment (``osworld``) and the episode toolbox load by name from the registries."""
