"""The smoke stage's checks (pure: requests and judges) and the driver that sends them."""
