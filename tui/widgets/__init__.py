"""Widgets of the main screen: the chat column (`chat`) and the live panel (`panel`)."""
